//! The Debian package (docs/packaging.md), on this machine: built by `scripts/build-deb.sh
//! --ci` from the suite's own `gma` and `gma-agent` (or `GMA_DEB=path.deb`), installed with
//! `dpkg -i`, its units checked by `systemd-analyze verify`, every role started from its
//! installed config without systemd — the unit's own ExecStart line, as the unit's User=
//! (setpriv), in its WorkingDirectory= — and seen serving (the agent, `/usr/bin/gma-agent`,
//! registered with the installed directory, answering `gma query` and obeying `gma agent
//! set|disable|enable`, kept in its state directory), then `dpkg -r` and `dpkg --purge` remove
//! it.
//!
//! Needs root, dpkg, systemd-analyze and setpriv (the CI machine has them; under `CI=true` a
//! missing one fails the test). The shipped configs listen on fixed loopback ports
//! (127.0.0.1:7000 ...): the test rewrites those addresses in the installed /etc/gma files to
//! reserved ports (`reserved_addr`) before starting the roles, so it cannot clash with parallel tests; the command
//! lines are the installed units' unchanged. It is the only test that touches /etc/gma,
//! /var/lib/gma, /usr/bin/gma, /usr/bin/gma-agent or the `gma` user (one test function: nothing to serialize).
// A test: a set-up step that fails is a failed test.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use gma_tests as common;
use gma_tests::netns::missing_capability;
use gma_tests::{reserved_addr, wait_until, Proc};

const UNIT_DIR: &str = "/usr/lib/systemd/system";
/// The units the package ships, with the instance the test starts of a template.
const UNITS: [&str; 6] = [
    "gma-agent.service",
    "gma-archiver.service",
    "gma-broker.service",
    "gma-dashboard.service",
    "gma-directory@.service",
    "gma-rescheduler.service",
];
/// The executables the package installs: every role and the clients, and the agent alone.
const BINARIES: [&str; 2] = ["/usr/bin/gma", "/usr/bin/gma-agent"];
/// The loopback addresses of the shipped single-host set-up (packaging/debian/etc).
const SHIPPED: [&str; 6] = [
    "127.0.0.1:7000", // directory member 1
    "127.0.0.1:7001", // agent
    "127.0.0.1:7200", // rescheduler
    "127.0.0.1:7400", // archiver
    "127.0.0.1:7500", // dashboard
    "127.0.0.1:7510", // broker
];

/// Runs a command to completion: (success, stdout, stderr).
fn run(program: &str, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {program}: {e}"));
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Runs a command that must succeed; its stdout.
fn must(program: &str, args: &[&str]) -> String {
    let (ok, out, err) = run(program, args);
    assert!(ok, "{program} {args:?} failed:\n{out}\n{err}");
    out
}

fn have(program: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// dpkg's status of the package (`install ok installed`, `deinstall ok config-files`), or
/// None when dpkg does not know it (never installed, or purged).
fn package_status() -> Option<String> {
    let (ok, out, _) = run("dpkg-query", &["-W", "-f=${Status}", "gma"]);
    (ok && !out.trim().is_empty()).then(|| out.trim().to_string())
}

/// The `[Service]` keys of an installed unit that say how systemd would start it.
#[derive(Debug)]
struct ServiceLine {
    argv: Vec<String>,
    user: String,
    group: String,
    working_dir: PathBuf,
    env: Vec<(String, String)>,
}

/// Expands the one specifier the units use (`%i`, the instance) and `%%`; anything else a
/// unit could say (other specifiers, quoting, `$VAR`, exec prefixes) is refused so that the
/// test never runs a different command line than systemd would.
fn expand(value: &str, instance: &str) -> String {
    let mut out = String::new();
    let mut chars = value.chars();
    while let Some(c) = chars.next() {
        match c {
            '%' => match chars.next() {
                Some('i') => out.push_str(instance),
                Some('%') => out.push('%'),
                other => panic!("unit specifier %{other:?} in {value:?}: the test only expands %i"),
            },
            '"' | '\'' | '$' | '\\' => {
                panic!("{value:?}: quoting and variables are not expanded by this test")
            }
            c => out.push(c),
        }
    }
    out
}

fn service_line(unit_file: &Path, instance: &str) -> ServiceLine {
    let text = std::fs::read_to_string(unit_file).unwrap();
    let mut section = String::new();
    let mut keys: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if line.starts_with('[') {
            section = line.to_string();
            continue;
        }
        assert!(
            !line.ends_with('\\'),
            "{}: continued lines are not parsed",
            unit_file.display()
        );
        if section == "[Service]" {
            let (k, v) = line.split_once('=').unwrap();
            keys.entry(k.trim().into()).or_default().push(v.trim().into());
        }
    }
    let one = |k: &str| -> String {
        let v = keys
            .get(k)
            .unwrap_or_else(|| panic!("{}: no {k}=", unit_file.display()));
        assert_eq!(
            v.len(),
            1,
            "{}: {k}= given {} times",
            unit_file.display(),
            v.len()
        );
        expand(&v[0], instance)
    };
    let exec = one("ExecStart");
    assert!(
        exec.starts_with('/'),
        "{}: ExecStart must start with an absolute path and no prefix: {exec}",
        unit_file.display()
    );
    let env = keys
        .get("Environment")
        .into_iter()
        .flatten()
        .flat_map(|v| {
            expand(v, instance)
                .split_whitespace()
                .map(|kv| {
                    let (k, v) = kv.split_once('=').unwrap();
                    (k.to_string(), v.to_string())
                })
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(
        !keys.contains_key("EnvironmentFile"),
        "EnvironmentFile= is not read by this test"
    );
    ServiceLine {
        argv: exec.split_whitespace().map(String::from).collect(),
        user: one("User"),
        group: one("Group"),
        working_dir: PathBuf::from(one("WorkingDirectory")),
        env,
    }
}

/// Starts a unit's ExecStart the way systemd would (as User=/Group= with the user's groups,
/// in WorkingDirectory=, with systemd's default PATH and the unit's Environment=, nothing
/// else), waiting for "gma ROLE listening on".
fn start_unit(unit: &str, instance: &str, role: &str) -> Proc {
    let s = service_line(&Path::new(UNIT_DIR).join(unit), instance);
    let mut cmd = Command::new("setpriv");
    cmd.args(["--reuid", &s.user, "--regid", &s.group, "--init-groups", "--"])
        .current_dir(&s.working_dir)
        .env_clear()
        .env("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin");
    for (k, v) in &s.env {
        cmd.env(k, v);
    }
    let argv: Vec<&str> = s.argv.iter().map(String::as_str).collect();
    Proc::start_cmd(cmd, &argv, &format!("gma {role} listening on"))
}

/// `/usr/bin/gma search PATTERN --directory D [--consumers] --output json`, as the records.
fn search(dir: &str, pattern: &str, consumers: bool) -> Result<Vec<serde_json::Value>, String> {
    let mut args = vec!["search", pattern, "--directory", dir, "--output", "json"];
    if consumers {
        args.push("--consumers");
    }
    let (ok, out, err) = run("/usr/bin/gma", &args);
    if !ok {
        return Err(err);
    }
    let v: serde_json::Value = serde_json::from_str(&out).map_err(|e| format!("{e}: {out}"))?;
    Ok(v.as_array().cloned().unwrap_or_default())
}

fn uid_of(user: &str) -> Option<u32> {
    let (ok, out, _) = run("id", &["-u", user]);
    ok.then(|| out.trim().parse().ok()).flatten()
}

/// Purges the package when the test ends, passed or failed, so that a failure leaves no
/// installed package, user or state on the machine.
struct PurgeOnDrop;

impl Drop for PurgeOnDrop {
    fn drop(&mut self) {
        if package_status().is_some() {
            let _ = Command::new("dpkg").args(["--purge", "gma"]).status();
        }
    }
}

#[test]
fn the_package_installs_its_roles_serve_and_it_uninstalls() {
    for tool in ["dpkg", "dpkg-query", "systemd-analyze", "setpriv"] {
        if !have(tool) {
            missing_capability(
                "installing the Debian package",
                &format!("{tool} is not installed"),
            );
            return;
        }
    }
    if run("id", &["-u"]).1.trim() != "0" {
        missing_capability("installing the Debian package", "dpkg -i needs root");
        return;
    }
    if package_status().is_some() {
        // Our own package left by a killed run is purged; anything else is not ours.
        let maint = must("dpkg-query", &["-W", "-f=${Maintainer}", "gma"]);
        assert!(
            maint.contains("GMA fabric developers"),
            "a package named gma from {maint:?} is installed: remove it first (dpkg --purge gma)"
        );
        must("dpkg", &["--purge", "gma"]);
    }

    // The package: GMA_DEB, or the CI package of this tree's gma.
    let deb = match std::env::var("GMA_DEB") {
        Ok(p) => PathBuf::from(p),
        Err(_) => {
            let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/build-deb.sh");
            let bin = common::gma_bin();
            let agent = common::agent_bin();
            let out = must(
                script.to_str().unwrap(),
                &["--ci", bin.to_str().unwrap(), agent.to_str().unwrap()],
            );
            PathBuf::from(out.lines().last().unwrap().trim())
        }
    };
    assert!(deb.is_file(), "{} is not a file", deb.display());

    // Install; whatever happens next, the package goes again at the end (after the roles,
    // which are declared later and so stopped first).
    let _purge = PurgeOnDrop;
    must("dpkg", &["-i", deb.to_str().unwrap()]);
    let files = must("dpkg", &["-L", "gma"]);
    let mut units: Vec<&str> = files
        .lines()
        .filter_map(|l| l.strip_prefix("/usr/lib/systemd/system/"))
        .collect();
    units.sort();
    assert_eq!(units, UNITS, "the units the package installs");
    for bin in BINARIES {
        assert!(Path::new(bin).is_file(), "{bin} is not installed");
    }
    // The agent's unit runs the agent-only executable.
    let agent_line = service_line(&Path::new(UNIT_DIR).join("gma-agent.service"), "");
    assert_eq!(
        agent_line.argv,
        ["/usr/bin/gma-agent", "--config", "/etc/gma/agent.toml"],
        "gma-agent.service's ExecStart"
    );
    let conffiles = must("dpkg-query", &["-W", "-f=${Conffiles}", "gma"]);
    let configs = [
        "agent.toml",
        "archiver.toml",
        "broker.toml",
        "dashboard.toml",
        "directory-1.toml",
        "rescheduler.toml",
    ];
    for c in configs {
        assert!(
            conffiles.contains(&format!("/etc/gma/{c} ")),
            "/etc/gma/{c} is not a conffile: {conffiles}"
        );
    }
    // The maintainer scripts made the user and its state directory.
    let gma_uid = uid_of("gma").expect("postinst creates the gma user");
    let state = std::fs::metadata("/var/lib/gma").expect("postinst creates /var/lib/gma");
    assert_eq!(std::os::unix::fs::MetadataExt::uid(&state), gma_uid);

    // Every unit verifies, silently (an unknown key is only a warning: it fails here too).
    let mut verify: Vec<String> = UNITS
        .iter()
        .map(|u| format!("{UNIT_DIR}/{}", u.replace("@.", "@1.")))
        .collect();
    verify.insert(0, "verify".into());
    let args: Vec<&str> = verify.iter().map(String::as_str).collect();
    let (ok, out, err) = run("systemd-analyze", &args);
    assert!(
        ok && out.trim().is_empty() && err.trim().is_empty(),
        "systemd-analyze {args:?}:\n{out}\n{err}"
    );

    // The sandboxing holds by systemd's own measure: an exposure of at most 2.0 of 10 for every
    // unit (they score 1.7, the agent 1.8, on systemd 252); a unit that lost its hardening
    // directives scores far above (an unsandboxed service: 9.6).
    for unit in &verify[1..] {
        let (ok, out, err) = run(
            "systemd-analyze",
            &["security", "--offline=yes", "--threshold=20", unit],
        );
        let overall = out.lines().find(|l| l.contains("Overall exposure")).unwrap_or("");
        assert!(
            ok,
            "systemd-analyze security {unit}: above 2.0 ({overall}):\n{out}\n{err}"
        );
    }

    // Free ports instead of the shipped ones (see the module doc), in the installed files.
    let fresh: BTreeMap<&str, String> = SHIPPED.iter().map(|a| (*a, reserved_addr())).collect();
    for c in configs {
        let path = Path::new("/etc/gma").join(c);
        let text = std::fs::read_to_string(&path).unwrap();
        let mut new = text.clone();
        for (old, addr) in &fresh {
            new = new.replace(&format!("\"{old}\""), &format!("\"{addr}\""));
        }
        assert_ne!(new, text, "{c} names none of the shipped addresses {SHIPPED:?}");
        std::fs::write(&path, new).unwrap();
    }
    let dir = fresh["127.0.0.1:7000"].clone();
    let agent = fresh["127.0.0.1:7001"].clone();

    // The roles, as their units start them: the directory member first.
    let mut procs = vec![start_unit("gma-directory@.service", "1", "directory")];
    procs.push(start_unit("gma-agent.service", "", "producer"));
    for (unit, role) in [
        ("gma-archiver.service", "archiver"),
        ("gma-broker.service", "broker"),
        ("gma-dashboard.service", "dashboard"),
        ("gma-rescheduler.service", "rescheduler"),
    ] {
        procs.push(start_unit(unit, "", role));
    }
    for p in &procs {
        let pid = p.child.id();
        let uid = std::fs::read_to_string(format!("/proc/{pid}/status"))
            .unwrap()
            .lines()
            .find_map(|l| {
                l.strip_prefix("Uid:")
                    .map(|u| u.split_whitespace().next().unwrap().to_string())
            })
            .unwrap();
        assert_eq!(uid, gma_uid.to_string(), "pid {pid} does not run as the gma user");
    }

    // The agent registers with the installed directory, with its host sensors' events.
    let mut last = String::new();
    let mut agent_source = String::new();
    let registered = wait_until(Duration::from_secs(60), || {
        match search(&dir, "host.cpu", false) {
            Ok(records) => {
                let rec = records.iter().find(|r| r["address"] == format!("http://{agent}"));
                if let Some(r) = rec {
                    agent_source = r["id"]
                        .as_str()
                        .unwrap_or("")
                        .split('@')
                        .next()
                        .unwrap_or("")
                        .to_string();
                }
                last = serde_json::to_string(&records).unwrap();
                rec.is_some()
            }
            Err(e) => {
                last = e;
                false
            }
        }
    });
    assert!(
        registered,
        "the agent on {agent} never registered host.cpu in {dir}; last: {last}"
    );
    // ... and answers a query through it.
    let answered = wait_until(Duration::from_secs(30), || {
        let (ok, out, err) = run(
            "/usr/bin/gma",
            &["query", "host.load", "--directory", &dir, "--output", "json"],
        );
        last = format!("{out}{err}");
        ok && out.contains(&format!("\"{agent_source}\""))
    });
    assert!(
        answered,
        "gma query host.load gave no event of {agent_source}; last: {last}"
    );

    // The installed agent obeys the control service: a period set, a sensor disabled and
    // enabled again, a process watch (of itself), kept in its state directory (agent.toml's
    // state_dir, written as the gma user).
    for args in [
        ["agent", "set", "host.mem", "5000"].as_slice(),
        &["agent", "disable", "host.disk"],
        &["agent", "enable", "host.disk"],
        &["agent", "watch", "itself", "--comm", "gma-agent"],
    ] {
        let mut argv = args.to_vec();
        argv.extend(["--producer", agent.as_str()]);
        must("/usr/bin/gma", &argv);
    }
    let sensors = must(
        "/usr/bin/gma",
        &["agent", "sensors", "--producer", &agent, "--output", "json"],
    );
    assert!(
        sensors.contains("host.mem") && sensors.contains("5000"),
        "gma agent sensors after set: {sensors}"
    );
    let kept = Path::new("/var/lib/gma/agent/control.json");
    let m = std::fs::metadata(kept).unwrap_or_else(|e| panic!("{}: {e}", kept.display()));
    assert_eq!(
        std::os::unix::fs::MetadataExt::uid(&m),
        gma_uid,
        "control.json owner"
    );

    // The other roles registered too (their own producer records, the archiver's consumer).
    for (pattern, id, consumers) in [
        ("*", format!("broker@{}", fresh["127.0.0.1:7510"]), false),
        ("*", format!("rescheduler@{}", fresh["127.0.0.1:7200"]), false),
        ("*", format!("archiver@{}", fresh["127.0.0.1:7400"]), true),
    ] {
        let seen = wait_until(Duration::from_secs(30), || {
            search(&dir, pattern, consumers).is_ok_and(|rs| rs.iter().any(|r| r["id"] == id.as_str()))
        });
        assert!(seen, "{id} never appeared in the directory");
    }
    let (status, body) = common::http_get(&fresh["127.0.0.1:7500"], "/").unwrap();
    assert_eq!(status, 200, "the dashboard's page: {body}");

    // State went where the units allow writes, owned by the gma user.
    for d in ["/var/lib/gma/directory-1", "/var/lib/gma/archive"] {
        let m = std::fs::metadata(d).unwrap_or_else(|e| panic!("{d}: {e}"));
        assert_eq!(std::os::unix::fs::MetadataExt::uid(&m), gma_uid, "{d} owner");
    }

    // Stop them as systemd would (SIGTERM): each drains and exits cleanly.
    for p in procs.iter_mut().rev() {
        let status = p.terminate();
        assert!(
            status.is_some_and(|s| s.success()),
            "{:?} after SIGTERM; stderr: {}",
            status,
            p.stderr_text()
        );
    }

    // Reinstalling (an upgrade in place) keeps the edited configs and the user.
    must("dpkg", &["-i", deb.to_str().unwrap()]);
    let agent_conf = std::fs::read_to_string("/etc/gma/agent.toml").unwrap();
    assert!(
        agent_conf.contains(&agent),
        "the reinstall replaced the edited agent.toml: {agent_conf}"
    );
    assert_eq!(uid_of("gma"), Some(gma_uid), "the reinstall changed the gma user");

    // Remove: the program and units go; configs, state and the user stay (Debian's `remove`).
    must("dpkg", &["-r", "gma"]);
    for bin in BINARIES {
        assert!(!Path::new(bin).exists(), "{bin} left after dpkg -r");
    }
    for u in UNITS {
        assert!(!Path::new(UNIT_DIR).join(u).exists(), "{u} left after dpkg -r");
    }
    assert!(
        Path::new("/etc/gma/agent.toml").exists(),
        "dpkg -r keeps the conffiles"
    );
    assert!(
        Path::new("/var/lib/gma/directory-1").exists(),
        "dpkg -r keeps the state"
    );
    assert!(uid_of("gma").is_some(), "dpkg -r keeps the gma user");
    assert_eq!(package_status().as_deref(), Some("deinstall ok config-files"));

    // Purge: configs, state, user and group are gone; dpkg forgets the package.
    must("dpkg", &["--purge", "gma"]);
    for p in ["/etc/gma", "/var/lib/gma"] {
        assert!(!Path::new(p).exists(), "{p} left after dpkg --purge");
    }
    assert!(uid_of("gma").is_none(), "the gma user is left after dpkg --purge");
    assert!(
        !run("getent", &["group", "gma"]).0,
        "the gma group is left after dpkg --purge"
    );
    assert_eq!(package_status(), None, "dpkg still knows gma after --purge");
}
