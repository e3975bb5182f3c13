//! Runtime control of a producer (docs/control.md), real processes over mTLS: a period change
//! takes effect within one period and survives a restart; an identity without
//! `producer.control` gets PERMISSION_DENIED and a `gma.audit` event records the attempt; bad
//! input gets its precise status; a process watch added at run time reports its process's exit.

#![allow(clippy::unwrap_used)]

use gma_tests as common;

use std::time::Duration;

use common::*;
use gma_proto::v1 as pb;
use pb::control_client::ControlClient;
use tonic::transport::Channel;
use tonic::Code;

const POLICY: &str = r#"default = "deny"

# carol may read but not steer.
[[rule]]
cn = "carol"
actions = ["producer.control"]
effect = "deny"

[[rule]]
org = "site1"
actions = ["*"]
effect = "allow"
"#;

/// The simulated hosts' configured period: one minute, so any sample after the first proves
/// the shorter period set through the control service.
const SIM_PERIOD_MS: u64 = 60_000;

struct Site {
    _tmp: tempfile::TempDir,
    dir: std::path::PathBuf,
}

impl Site {
    fn new() -> Site {
        let tmp = tempdir();
        let dir = tmp.path().to_path_buf();
        make_certs(
            &dir,
            &["ca"],
            &[
                ("ca", "node1", "site1"),
                ("ca", "alice", "site1"),
                ("ca", "carol", "site1"),
            ],
        );
        std::fs::write(dir.join("policy.toml"), POLICY).unwrap();
        std::fs::write(
            dir.join("sim.toml"),
            format!("period_ms = {SIM_PERIOD_MS}\n[[host]]\nname = \"h1\"\ncpus = 4\nmemory_mb = 1024\nload = 1.5\n"),
        )
        .unwrap();
        Site { _tmp: tmp, dir }
    }

    fn path(&self, p: &str) -> String {
        self.dir.join(p).to_str().unwrap().to_string()
    }

    /// A producer of the simulated host with its state in `<dir>/state`.
    fn producer(&self) -> Proc {
        let state = self.path("state");
        self.producer_of("sim.toml", &["--state-dir", &state])
    }

    /// A producer of the simulation in `<dir>/<sim>` under the policy, with `extra` flags.
    fn producer_of(&self, sim: &str, extra: &[&str]) -> Proc {
        let (sim, policy) = (self.path(sim), self.path("policy.toml"));
        let (cert, key, ca) = (
            self.path("certs/node1.pem"),
            self.path("certs/node1.key"),
            self.path("ca/ca.pem"),
        );
        let mut args = vec![
            "--no-host-sensors",
            "--simulate",
            &sim,
            "--access-policy",
            &policy,
            "--tls-cert",
            &cert,
            "--tls-key",
            &key,
            "--tls-client-ca",
            &ca,
        ];
        args.extend_from_slice(extra);
        Proc::producer(&args)
    }

    /// `gma ARGS` against `prod` as `who`.
    fn run(&self, prod: &Proc, who: &str, args: &[&str]) -> Run {
        let (ca, cert, key) = (
            self.path("ca/ca.pem"),
            self.path(&format!("certs/{who}.pem")),
            self.path(&format!("certs/{who}.key")),
        );
        let mut all: Vec<&str> = args.to_vec();
        all.extend_from_slice(&[
            "--producer",
            &prod.addr,
            "--tls-ca",
            &ca,
            "--tls-cert",
            &cert,
            "--tls-key",
            &key,
        ]);
        gma(&all, Duration::from_secs(20))
    }

    async fn control(&self, prod: &Proc, who: &str) -> ControlClient<Channel> {
        ControlClient::new(mtls_channel(&self.dir, &prod.addr, who).await)
    }
}

async fn sensor(c: &mut ControlClient<Channel>, name: &str) -> pb::SensorInfo {
    let r = c
        .list_sensors(pb::ListSensorsRequest {})
        .await
        .unwrap()
        .into_inner();
    r.sensors
        .into_iter()
        .find(|s| s.name == name)
        .unwrap_or_else(|| panic!("no sensor {name}"))
}

/// Waits until the sensor `name` has taken at least `n` samples.
async fn samples_reach(c: &mut ControlClient<Channel>, name: &str, n: u64) -> pb::SensorInfo {
    let what = format!("{name} to take {n} samples");
    wait_for(&what, Duration::from_secs(30), || {
        let mut c = c.clone();
        async move {
            let s = sensor(&mut c, name).await;
            if s.samples >= n {
                Ok(s)
            } else {
                Err(format!(
                    "{} samples so far at period {} ms",
                    s.samples, s.period_ms
                ))
            }
        }
    })
    .await
}

/// The `gma.audit` events the producer still holds, as JSON lines (via `gma query --since`).
fn audit_lines(site: &Site, prod: &Proc) -> Vec<String> {
    let r = site.run(
        prod,
        "alice",
        &["query", "gma.audit", "--since", "10m", "--output", "json"],
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    r.stdout.lines().map(str::to_string).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_period_change_applies_within_one_period_persists_and_is_audited() {
    let site = Site::new();
    let mut prod = site.producer();
    let mut alice = site.control(&prod, "alice").await;

    let before = sensor(&mut alice, "sim").await;
    assert_eq!(before.period_ms, SIM_PERIOD_MS);
    assert_eq!(before.configured_period_ms, SIM_PERIOD_MS);
    assert!(before.enabled);

    // Bad input: a precise status each, nothing changed.
    let e = alice
        .set_period(pb::SetPeriodRequest {
            sensor: "no.such".into(),
            period_ms: 100,
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{}", e.message());
    assert!(
        e.message().contains("sim"),
        "the message lists the sensors: {}",
        e.message()
    );
    for ms in [0, 3_600_001, u64::MAX] {
        let e = alice
            .set_period(pb::SetPeriodRequest {
                sensor: "sim".into(),
                period_ms: ms,
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{ms}: {}", e.message());
    }
    let e = alice
        .unwatch(pb::RemoveWatchRequest { name: "none".into() })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{}", e.message());
    let e = alice
        .watch(pb::ProcessWatchRequest {
            name: "two-selectors".into(),
            comm: "sleep".into(),
            pid: 1,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{}", e.message());

    // The period through the CLI: 60 s down to 200 ms. Any sample after the first (taken at
    // start) comes from the new period: the old one would not sample again for a minute.
    let r = site.run(
        &prod,
        "alice",
        &["agent", "set", "sim", "200", "--output", "json"],
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(r.stdout.contains("period_ms=200"), "{}", r.stdout);
    let s = samples_reach(&mut alice, "sim", 3).await;
    assert_eq!(s.period_ms, 200);
    println!(
        "sim after the change: {} samples, mean {:.1} us per sample, cost {:.4}% of one CPU",
        s.samples, s.mean_sample_us, s.cost_pct
    );

    // carol may not steer: PERMISSION_DENIED on the service and from the CLI, both audited.
    let mut carol = site.control(&prod, "carol").await;
    let e = carol
        .set_period(pb::SetPeriodRequest {
            sensor: "sim".into(),
            period_ms: 5,
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{}", e.message());
    assert!(e.message().contains("producer.control"), "{}", e.message());
    let r = site.run(&prod, "carol", &["agent", "disable", "sim"]);
    assert_ne!(r.code, 0, "carol disabled a sensor: {}", r.stdout);
    assert!(r.stderr.contains("PermissionDenied"), "{}", r.stderr);
    assert_eq!(
        sensor(&mut alice, "sim").await.period_ms,
        200,
        "a denied call changed nothing"
    );

    let lines = audit_lines(&site, &prod);
    let denied: Vec<&String> = lines
        .iter()
        .filter(|l| l.contains("carol") && l.contains("denied") && l.contains("sensor.period"))
        .collect();
    assert_eq!(denied.len(), 1, "one denied set_period by carol in {lines:#?}");
    assert!(
        lines
            .iter()
            .any(|l| l.contains("carol") && l.contains("sensor.disable") && l.contains("denied")),
        "{lines:#?}"
    );
    assert!(
        lines.iter().any(|l| l.contains("alice")
            && l.contains("allowed")
            && l.contains("period_ms=60000")
            && l.contains("period_ms=200")),
        "the allowed change with before and after: {lines:#?}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.contains("refused") && l.contains("no.such")),
        "{lines:#?}"
    );

    // A restart keeps the change: the new producer runs sim at 200 ms from the start.
    prod.terminate();
    let prod = site.producer();
    let mut alice = site.control(&prod, "alice").await;
    let s = sensor(&mut alice, "sim").await;
    assert_eq!((s.period_ms, s.configured_period_ms), (200, SIM_PERIOD_MS));
    samples_reach(&mut alice, "sim", 3).await;

    // Disabled stays disabled across a restart too; the listing says so.
    let r = site.run(&prod, "alice", &["agent", "disable", "sim"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let r = site.run(&prod, "alice", &["agent", "sensors", "--output", "json"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let sim = json_lines(&r.stdout)
        .into_iter()
        .find(|v| v["name"] == "sim")
        .unwrap();
    assert_eq!(sim["enabled"], false, "{}", r.stdout);
    assert_eq!(sim["period_ms"], 200, "{}", r.stdout);
    let state = std::fs::read_to_string(site.dir.join("state/control.json")).unwrap();
    assert!(
        state.contains("\"sim\": 200") && state.contains("disabled"),
        "{state}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_watch_added_at_run_time_reports_its_exit() {
    let site = Site::new();
    let prod = site.producer();
    let mut alice = site.control(&prod, "alice").await;
    let mut child = std::process::Command::new("sleep").arg("600").spawn().unwrap();
    let pid = child.id().to_string();

    let r = site.run(
        &prod,
        "alice",
        &["agent", "watch", "sleeper", "--pid", &pid, "--period-ms", "100"],
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    let w = samples_reach(&mut alice, "process/sleeper", 2).await;
    assert!(w.runtime_watch);
    let e = alice
        .watch(pb::ProcessWatchRequest {
            name: "sleeper".into(),
            pid: 1,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::AlreadyExists, "{}", e.message());

    child.kill().unwrap();
    child.wait().unwrap();
    let seen = wait_until(Duration::from_secs(30), || {
        let r = site.run(
            &prod,
            "alice",
            &["query", "proc.event", "--since", "10m", "--output", "json"],
        );
        r.stdout
            .lines()
            .any(|l| l.contains("sleeper") && (l.contains("abnormal_exit") || l.contains("vanished")))
    });
    let r = site.run(
        &prod,
        "alice",
        &["query", "proc.event", "--since", "10m", "--output", "json"],
    );
    assert!(seen, "no exit of the watched process in proc.event: {}", r.stdout);

    let r = site.run(&prod, "alice", &["agent", "unwatch", "sleeper"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let r = site.run(&prod, "alice", &["agent", "sensors", "--output", "json"]);
    assert!(!r.stdout.contains("process/sleeper"), "{}", r.stdout);
}

/// An expensive sensor (a simulation of 3000 hosts sampled every 20 ms) under a small CPU
/// budget: the agent lengthens its period until it fits, and says so in `gma.budget`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cpu_budget_slows_the_costliest_sensor_until_the_agent_fits() {
    let site = Site::new();
    let budget = 5.0;
    std::fs::write(
        site.dir.join("heavy.toml"),
        "period_ms = 20\n[[generate]]\ncount = 3000\nprefix = \"n\"\nseed = 7\n",
    )
    .unwrap();
    let prod = site.producer_of(
        "heavy.toml",
        &[
            "--cpu-budget-pct",
            &budget.to_string(),
            "--budget-check-ms",
            "500",
            "--buffer-events",
            "200000",
        ],
    );
    let alice = site.control(&prod, "alice").await;

    // Wait until a check finds the agent within its budget with sim slowed.
    let fit = wait_for(
        "the agent to fit its CPU budget",
        Duration::from_secs(120),
        || {
            let mut c = alice.clone();
            async move {
                let r = c
                    .list_sensors(pb::ListSensorsRequest {})
                    .await
                    .map_err(|e| e.to_string())?
                    .into_inner();
                let sim = r
                    .sensors
                    .iter()
                    .find(|s| s.name == "sim")
                    .cloned()
                    .ok_or("no sim")?;
                if r.agent_cpu_pct >= 0.0 && r.agent_cpu_pct <= budget && sim.slowed_from_ms == 20 {
                    Ok((r.agent_cpu_pct, sim))
                } else {
                    Err(format!(
                        "agent at {:.2}% of one CPU, sim at {} ms (slowed from {})",
                        r.agent_cpu_pct, sim.period_ms, sim.slowed_from_ms
                    ))
                }
            }
        },
    )
    .await;
    let (cpu, sim) = fit;
    assert!(sim.period_ms > 20, "{sim:?}");
    println!(
        "budget {budget}% of one CPU: sim slowed from 20 ms to {} ms; the agent measured {cpu:.2}% \
         (sim's samples took {:.1} us each on average)",
        sim.period_ms, sim.mean_sample_us
    );

    // The events say which sensor, the periods, the measure and the budget.
    let r = site.run(
        &prod,
        "alice",
        &["query", "gma.budget", "--since", "10m", "--output", "json"],
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    let slowed: Vec<serde_json::Value> = json_lines(&r.stdout)
        .into_iter()
        .filter(|v| v.to_string().contains("slowed"))
        .collect();
    assert!(!slowed.is_empty(), "no slowed event: {}", r.stdout);
    let first = slowed[0].to_string();
    assert!(first.contains("sim"), "{first}");
    for v in json_lines(&r.stdout) {
        println!("gma.budget: {}", v["values"]);
    }
}

/// A monitor's rules through the same service: a rule added at run time fires, is listed,
/// survives a restart of the monitor and is removed; bad rules get precise statuses. (No
/// policy here: the monitor runs without TLS, every identity is allowed.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_monitor_rule_added_at_run_time_fires_persists_and_is_removed() {
    let tmp = tempdir();
    let data = tmp.path().join("dir");
    let dir = Proc::directory(&data, "127.0.0.1:0");
    let sim = tmp.path().join("sim.toml");
    std::fs::write(
        &sim,
        "period_ms = 100\n[[host]]\nname = \"db\"\ncpus = 4\nmemory_mb = 1024\nload = 1.0\n",
    )
    .unwrap();
    let prod = Proc::producer(&[
        "--directory",
        &dir.addr,
        "--no-host-sensors",
        "--simulate",
        sim.to_str().unwrap(),
    ]);
    let mcfg = tmp.path().join("monitor.toml");
    let state = tmp.path().join("mstate");
    std::fs::write(
        &mcfg,
        format!(
            "source = \"ops\"\nstate_dir = \"{}\"\n\
             [[rule]]\nname = \"configured\"\nevents = [\"host.load\"]\nwhen = 'load1 > 1000'\ncommand = [\"true\"]\n",
            state.display()
        ),
    )
    .unwrap();
    let monitor = |cfg: &std::path::Path| {
        Proc::start(
            &[
                "monitor",
                "--config",
                cfg.to_str().unwrap(),
                "--directory",
                &dir.addr,
                "--listen",
                "127.0.0.1:0",
            ],
            "gma monitor listening on",
        )
    };
    let mut mon = monitor(&mcfg);
    let mut c = ControlClient::new(connected(&mon.addr).await);
    let rules = c
        .list_sensors(pb::ListSensorsRequest {})
        .await
        .unwrap()
        .into_inner()
        .rules;
    assert_eq!(rules, vec!["configured: host.load when load1 > 1000".to_string()]);

    // Bad rules: not TOML, two tables, a bad `when`; a configuration rule cannot be removed.
    for (toml, what) in [
        ("[[rule]\n", "not TOML"),
        (
            "[[rule]]\nname = \"a\"\nevents = [\"x\"]\nwhen = 'a > 1'\ncommand = [\"true\"]\n\
             [[rule]]\nname = \"b\"\nevents = [\"x\"]\nwhen = 'a > 1'\ncommand = [\"true\"]\n",
            "two rules",
        ),
        (
            "[[rule]]\nname = \"a\"\nevents = [\"x\"]\nwhen = 'a >'\ncommand = [\"true\"]\n",
            "bad when",
        ),
    ] {
        let e = c
            .add_rule(pb::AddRuleRequest { toml: toml.into() })
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{what}: {}", e.message());
    }
    let e = c
        .remove_rule(pb::RemoveRuleRequest {
            name: "configured".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{}", e.message());

    // A rule added at run time fires on the simulated host (its command writes a marker).
    let marker = tmp.path().join("fired");
    let rule = tmp.path().join("rule.toml");
    std::fs::write(
        &rule,
        format!(
            "[[rule]]\nname = \"busy-db\"\nevents = [\"host.load\"]\nwhen = 'load1 > 5'\nhold_down_ms = 600000\n\
             command = [\"sh\", \"-c\", 'echo \"$GMA_RULE $GMA_SOURCE\" >> {}']\n",
            marker.display()
        ),
    )
    .unwrap();
    let r = gma(
        &[
            "agent",
            "rule-add",
            rule.to_str().unwrap(),
            "--producer",
            &mon.addr,
        ],
        Duration::from_secs(20),
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    let e = c
        .add_rule(pb::AddRuleRequest {
            toml: std::fs::read_to_string(&rule).unwrap(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::AlreadyExists, "{}", e.message());
    let r = gma(
        &["sim", "set", "db", "load=9", "--producer", &prod.addr],
        Duration::from_secs(20),
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    let read = || std::fs::read_to_string(&marker).unwrap_or_default();
    assert!(
        wait_until(Duration::from_secs(30), || read().contains("busy-db db")),
        "the added rule never fired; monitor log:\n{}",
        mon.stderr_text()
    );

    // The restarted monitor runs it again (from its state_dir), and it can be removed.
    mon.terminate();
    let mon = monitor(&mcfg);
    let r = gma(
        &["agent", "rules", "--producer", &mon.addr],
        Duration::from_secs(20),
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(
        r.stdout.contains("busy-db: host.load when load1 > 5 [runtime]"),
        "{}",
        r.stdout
    );
    let r = gma(
        &["agent", "rule-remove", "busy-db", "--producer", &mon.addr],
        Duration::from_secs(20),
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    let r = gma(
        &["agent", "rules", "--producer", &mon.addr],
        Duration::from_secs(20),
    );
    assert!(!r.stdout.contains("busy-db"), "{}", r.stdout);
    let audit = gma(
        &[
            "query",
            "gma.audit",
            "--since",
            "10m",
            "--producer",
            &mon.addr,
            "--output",
            "json",
        ],
        Duration::from_secs(20),
    );
    assert!(
        audit.stdout.contains("rule.remove") && audit.stdout.contains("busy-db"),
        "{}",
        audit.stdout
    );
}
