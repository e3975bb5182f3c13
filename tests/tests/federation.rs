//! Multi-site federation with real processes: three sites on loopback, each its own process
//! group (a directory, a producer of simulated hosts, a federation endpoint), linked with
//! `gma federation add`. Jobs are "1 h"-class jobs run at a time scale where they last about a
//! second; heartbeats are 200 ms (sessions expire after 600 ms) and the origin lease 1.5 s.
//!
//! Exactly-once is asserted from the `job.state` events of every site: a job's `started` and
//! `finished` are published by the site it runs at (`site == current`), and each appears once
//! per job across all sites.
//!
//! - imbalance: a saturated site forwards to idle ones and every job completes;
//! - a killed endpoint is excluded within the session timeout;
//! - a ring of saturated sites forwards no job more than once and runs every job once;
//! - a partition while a forwarded job is queued ends with the job run exactly once;
//! - mTLS: a session whose certificate does not name its site is refused; an outsider gets
//!   `site.summary` but PERMISSION_DENIED for `host.*`.

#![allow(clippy::unwrap_used)]

use gma_tests as common;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

const T: Duration = Duration::from_secs(30);
/// Job seconds per real second: a 600 s job runs for one second.
const SCALE: f64 = 1.0 / 600.0;

struct Site {
    name: String,
    dir: Proc,
    /// The simulated hosts (kept running for the site's lifetime).
    _sim: Proc,
    fed: Proc,
    /// `gma subscribe '*' --producer <endpoint>`: the endpoint's events since it started.
    events: Proc,
}

fn hosts_toml(hosts: &[(&str, u32, u32)]) -> String {
    let mut s = String::from("period_ms = 100\n");
    for (name, cpus, free) in hosts {
        s.push_str(&format!(
            "[[host]]\nname = \"{name}\"\ncpus = {cpus}\nmemory_mb = 8192\nfree_cpus = {free}\n"
        ));
    }
    s
}

fn fed_toml(site: &str, extra: &str) -> String {
    fed_toml_route(site, extra, "")
}

/// `extra`: top-level keys; `route`: more keys of `[route]`.
fn fed_toml_route(site: &str, extra: &str, route: &str) -> String {
    format!(
        "site = \"{site}\"\ntime_scale = {SCALE}\nheartbeat_ms = 200\nsummary_interval_ms = 500\n\
         push_debounce_ms = 20\nvalid_for_ms = 3000\norigin_lease_ms = 1500\nstatus_interval_ms = 500\n\
         tick_ms = 50\nlease_ttl_ms = 2000\n{extra}\n[route]\nmin_gain_s = 30\nforward_overhead_s = 5\n{route}\n"
    )
}

fn start_site(tmp: &Path, name: &str, hosts: &[(&str, u32, u32)], extra: &str) -> Site {
    start_site_route(tmp, name, hosts, extra, "")
}

fn start_site_route(tmp: &Path, name: &str, hosts: &[(&str, u32, u32)], extra: &str, route: &str) -> Site {
    let d = tmp.join(name);
    std::fs::create_dir_all(&d).unwrap();
    let dir = Proc::directory(&d.join("dir"), "127.0.0.1:0");
    let sim_file = d.join("sim.toml");
    std::fs::write(&sim_file, hosts_toml(hosts)).unwrap();
    let sim = Proc::simulated(&dir.addr, &sim_file, &["--lease-ttl-ms", "2000"]);
    let cfg = d.join("fed.toml");
    std::fs::write(&cfg, fed_toml_route(name, extra, route)).unwrap();
    let fed = Proc::role("federation", &dir.addr, &cfg);
    let events = Proc::start(
        &["subscribe", "*", "--producer", &fed.addr, "--output", "json"],
        "",
    );
    // The subscription is live once it delivers anything (site.summary, federation.status).
    assert!(
        wait_until(T, || !events.stdout_lines().is_empty()),
        "no events from {name}'s endpoint: {}",
        events.stderr_text()
    );
    Site {
        name: name.into(),
        dir,
        _sim: sim,
        fed,
        events,
    }
}

/// Links every pair of sites both ways with `gma federation add`.
fn link(sites: &[&Site]) {
    for a in sites {
        for b in sites {
            if a.name == b.name {
                continue;
            }
            federation_add(&a.dir.addr, &b.name, &b.fed.addr, None);
        }
    }
}

fn status(s: &Site) -> Value {
    federation_status(&s.fed.addr).unwrap_or_else(|e| panic!("{e}"))
}

fn peer(s: &Site, site: &str) -> Option<Value> {
    status(s)["peers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["site"] == site)
        .cloned()
}

/// Until `s` sees each of `peers` eligible (live, fresh summary).
fn wait_eligible(s: &Site, peers: &[&str]) {
    assert!(
        wait_until(T, || peers
            .iter()
            .all(|p| peer(s, p).is_some_and(|x| x["eligible"] == true))),
        "{} never saw {peers:?} eligible: {}",
        s.name,
        status(s)
    );
}

fn write_job(tmp: &Path, name: &str, cpus: u32, secs: f64) -> String {
    let p = tmp.join(format!("{name}.toml"));
    std::fs::write(
        &p,
        format!("name = \"{name}\"\ncpus = {cpus}\nmemory_mb = 1024\nreference_time_s = {secs}\n"),
    )
    .unwrap();
    p.to_str().unwrap().to_string()
}

fn submit(s: &Site, job: &str, count: u32, to: Option<&str>) -> Vec<String> {
    let c = count.to_string();
    let mut args = vec![
        "job",
        "submit",
        "--job",
        job,
        "--federation",
        &s.fed.addr,
        "--count",
        &c,
    ];
    if let Some(t) = to {
        args.extend(["--site", t]);
    }
    let r = gma(&args, T);
    assert_eq!(r.code, 0, "{}", r.stderr);
    r.stdout.lines().map(str::to_string).collect()
}

/// The jobs a site knows, by id.
fn jobs(s: &Site) -> BTreeMap<String, Value> {
    federation_jobs(&s.fed.addr)
}

fn all_finished(origin: &Site, ids: &[String]) -> bool {
    let known = jobs(origin);
    ids.iter()
        .all(|id| known.get(id).is_some_and(|j| j["state"] == "finished"))
}

/// Every `job.state` event published by the sites so far.
fn job_events(sites: &[&Site]) -> Vec<Value> {
    sites
        .iter()
        .flat_map(|s| json_lines(&s.events.stdout_lines().join("\n")))
        .filter(|e| e["name"] == "job.state")
        .map(|e| e["values"].clone())
        .collect()
}

/// Asserts that each of `ids` started exactly once and finished exactly once across all the
/// sites (counted where it ran); returns the site each ran at.
fn exactly_once(sites: &[&Site], ids: &[String]) -> BTreeMap<String, String> {
    let evs = job_events(sites);
    let mut ran_at = BTreeMap::new();
    for id in ids {
        let mine: Vec<&Value> = evs.iter().filter(|e| e["job"] == id.as_str()).collect();
        let here = |state: &str| -> Vec<&&Value> {
            mine.iter()
                .filter(|e| e["state"] == state && e["site"] == e["current"])
                .collect()
        };
        let started = here("started");
        assert_eq!(
            started.len(),
            1,
            "{id} started {} times: {mine:#?}",
            started.len()
        );
        assert_eq!(here("finished").len(), 1, "{id}: {mine:#?}");
        ran_at.insert(id.clone(), started[0]["site"].as_str().unwrap().to_string());
    }
    ran_at
}

/// Waits until every site's subscriber has the `finished` events of `ids` (events trail the
/// job list by a stream hop).
fn wait_events(sites: &[&Site], ids: &[String]) {
    assert!(wait_until(T, || {
        let evs = job_events(sites);
        ids.iter().all(|id| {
            evs.iter()
                .any(|e| e["job"] == id.as_str() && e["state"] == "finished" && e["site"] == e["current"])
        })
    }));
}

#[test]
fn imbalance_forwards_to_idle_sites_and_every_job_completes() {
    let tmp = tempdir();
    // A is saturated (its host has no free CPU and never will); B and C are idle.
    let a = start_site(tmp.path(), "A", &[("a1", 4, 0)], "");
    let b = start_site(tmp.path(), "B", &[("b1", 4, 4), ("b2", 4, 4)], "");
    let c = start_site(tmp.path(), "C", &[("c1", 4, 4), ("c2", 4, 4)], "");
    link(&[&a, &b, &c]);
    wait_eligible(&a, &["B", "C"]);
    let job = write_job(tmp.path(), "j", 2, 600.0);
    let ids = submit(&a, &job, 8, None);
    assert_eq!(ids.len(), 8);
    assert!(ids.iter().all(|id| id.starts_with("A/")), "{ids:?}");
    assert!(
        wait_until(T, || all_finished(&a, &ids)),
        "not all finished: {:#?}",
        jobs(&a)
    );
    let sites = [&a, &b, &c];
    wait_events(&sites, &ids);
    let ran = exactly_once(&sites, &ids);
    assert!(ran.values().all(|s| s == "B" || s == "C"), "{ran:?}");
    assert!(
        ran.values().any(|s| s == "B") && ran.values().any(|s| s == "C"),
        "both idle sites took work: {ran:?}"
    );
    let evs = job_events(&sites);
    for id in &ids {
        let fwd = evs
            .iter()
            .filter(|e| e["job"] == id.as_str() && e["state"] == "forwarded")
            .count();
        assert_eq!(fwd, 1, "{id}");
    }
    let st = status(&a);
    let out: u64 = st["peers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["forwarded_out"].as_u64().unwrap())
        .sum();
    assert_eq!(out, 8, "{st}");
    // Each idle site counts what it got.
    let got_b = peer(&b, "A").unwrap()["forwarded_in"].as_u64().unwrap();
    let got_c = peer(&c, "A").unwrap()["forwarded_in"].as_u64().unwrap();
    assert_eq!(got_b + got_c, 8);
    // The summaries outsiders see: site.summary events with the sites' CPUs.
    let summaries = json_lines(&b.events.stdout_lines().join("\n"));
    assert!(summaries
        .iter()
        .any(|e| e["name"] == "site.summary" && e["source"] == "B" && e["values"]["cpus_total"] == 8.0));
    // The dashboard's feed: federation.status per peer.
    assert!(summaries
        .iter()
        .any(|e| e["name"] == "federation.status" && e["source"] == "B/A"));
}

#[test]
fn utility_policy_forwards_a_job_that_could_start_at_home_to_a_peer_offering_more() {
    // Vasques' Algorithm 1 with real endpoints: A's host has 2 of 8 CPUs free, B's 4 of 4. The
    // job (1 CPU) wants 4 free CPUs (utility 1; 1 to 3 free: 0.5): B's resume offers 1 > A's
    // best 0.5, so A forwards it although it could start it at once (ttd would keep it).
    let tmp = tempdir();
    let a = start_site_route(tmp.path(), "A", &[("a1", 8, 2)], "", "policy = \"utility\"");
    let b = start_site_route(tmp.path(), "B", &[("b1", 4, 4)], "", "policy = \"utility\"");
    link(&[&a, &b]);
    wait_eligible(&a, &["B"]);
    let job = tmp.path().join("u.toml");
    std::fs::write(
        &job,
        "name = \"u\"\ncpus = 1\nreference_time_s = 600\nuser_class = \"local\"\n\
         [[utility]]\nattribute = \"free_cpus\"\nintervals = [{ min = 4, utility = 1.0 }, { min = 1, utility = 0.5 }]\n",
    )
    .unwrap();
    let ids = submit(&a, job.to_str().unwrap(), 1, None);
    assert!(wait_until(T, || all_finished(&a, &ids)), "{:#?}", jobs(&a));
    let sites = [&a, &b];
    wait_events(&sites, &ids);
    let ran = exactly_once(&sites, &ids);
    assert_eq!(ran[&ids[0]], "B", "{ran:?}");
}

#[test]
fn a_killed_endpoint_is_excluded_within_the_session_timeout() {
    let tmp = tempdir();
    let a = start_site(tmp.path(), "A", &[("a1", 4, 0)], "");
    let b = start_site(tmp.path(), "B", &[("b1", 4, 4), ("b2", 4, 4)], "");
    let mut c = start_site(tmp.path(), "C", &[("c1", 4, 4), ("c2", 4, 4)], "");
    link(&[&a, &b, &c]);
    wait_eligible(&a, &["B", "C"]);
    c.fed.kill();
    let t0 = Instant::now();
    assert!(wait_until(T, || peer(&a, "C")
        .is_some_and(|p| p["live"] == false && p["eligible"] == false)));
    let excluded_after = t0.elapsed();
    // 3 heartbeats of 200 ms, plus one tick of the manager and the time a `gma` command takes.
    assert!(
        excluded_after < Duration::from_millis(600 + 900),
        "excluded after {excluded_after:?}"
    );
    eprintln!("C excluded at A {excluded_after:?} after its endpoint was killed");
    // Work now goes to B only, and completes.
    let job = write_job(tmp.path(), "k", 2, 600.0);
    let ids = submit(&a, &job, 4, None);
    assert!(wait_until(T, || all_finished(&a, &ids)), "{:#?}", jobs(&a));
    let sites = [&a, &b];
    wait_events(&sites, &ids);
    let ran = exactly_once(&sites, &ids);
    assert!(ran.values().all(|s| s == "B"), "{ran:?}");
}

#[test]
fn a_ring_of_saturated_sites_forwards_no_job_twice_and_runs_each_once() {
    let tmp = tempdir();
    let a = start_site(tmp.path(), "A", &[("a1", 4, 4)], "");
    let b = start_site(tmp.path(), "B", &[("b1", 4, 4)], "");
    let c = start_site(tmp.path(), "C", &[("c1", 4, 4)], "");
    link(&[&a, &b, &c]);
    wait_eligible(&a, &["B", "C"]);
    wait_eligible(&b, &["A", "C"]);
    wait_eligible(&c, &["A", "B"]);
    // Each site gets three times what it can run; A's jobs are shorter, so A frees up first.
    let short = write_job(tmp.path(), "short", 2, 300.0);
    let long = write_job(tmp.path(), "long", 2, 900.0);
    let mut ids = submit(&a, &short, 6, None);
    ids.extend(submit(&b, &long, 6, None));
    ids.extend(submit(&c, &long, 6, None));
    assert_eq!(ids.len(), 18);
    let sites = [&a, &b, &c];
    let done = || {
        let mut all = jobs(&a);
        all.extend(jobs(&b).into_iter().filter(|(id, _)| id.starts_with("B/")));
        all.extend(jobs(&c).into_iter().filter(|(id, _)| id.starts_with("C/")));
        ids.iter()
            .all(|id| all.get(id).is_some_and(|j| j["state"] == "finished"))
    };
    assert!(wait_until(Duration::from_secs(60), done), "not all finished");
    wait_events(&sites, &ids);
    exactly_once(&sites, &ids);
    let evs = job_events(&sites);
    let mut forwarded = 0;
    for id in &ids {
        let fwd = evs
            .iter()
            .filter(|e| e["job"] == id.as_str() && e["state"] == "forwarded")
            .count();
        assert!(fwd <= 1, "{id} forwarded {fwd} times");
        forwarded += fwd;
        assert!(
            evs.iter()
                .filter(|e| e["job"] == id.as_str())
                .all(|e| e["hops"].as_f64().unwrap() <= 1.0),
            "{id}"
        );
    }
    eprintln!("ring: {forwarded} of 18 jobs forwarded once, none twice");
}

#[test]
fn a_partition_while_a_forwarded_job_is_queued_ends_with_the_job_run_once() {
    let tmp = tempdir();
    let a = start_site(tmp.path(), "A", &[("a1", 4, 4)], "");
    let b = start_site(tmp.path(), "B", &[("b1", 4, 4)], "");
    let c = start_site(tmp.path(), "C", &[("c1", 4, 4)], "");
    link(&[&a, &b, &c]);
    wait_eligible(&a, &["B", "C"]);
    wait_eligible(&b, &["A"]);
    // B is busy for ~6 s with a job of its own.
    let busy = write_job(tmp.path(), "busy", 4, 3600.0);
    let bid = submit(&b, &busy, 1, None);
    assert!(wait_until(T, || jobs(&b)[&bid[0]]["state"] == "running"));
    // A sends J to B (an operator's choice): it waits in B's queue.
    let j = write_job(tmp.path(), "J", 4, 600.0);
    let jid = submit(&a, &j, 1, Some("B")).remove(0);
    assert!(wait_until(T, || jobs(&b)
        .get(&jid)
        .is_some_and(|x| x["state"] == "queued")));
    assert_eq!(jobs(&a)[&jid]["state"], "forwarded");
    // Partition: B's endpoint stops (SIGSTOP) while J is queued there.
    let pid = b.fed.child.id().to_string();
    assert!(std::process::Command::new("kill")
        .args(["-STOP", &pid])
        .status()
        .unwrap()
        .success());
    let t0 = Instant::now();
    // A re-places J only after origin_lease_ms + 2 heartbeats (1.9 s) of silence, then runs it.
    assert!(wait_until(T, || jobs(&a)[&jid]["state"] == "running"
        || jobs(&a)[&jid]["state"] == "finished"));
    let replaced_after = t0.elapsed();
    let _ = std::process::Command::new("kill").args(["-CONT", &pid]).status();
    // Never before the lease and two heartbeats since A last heard B (at most one heartbeat
    // before the stop).
    assert!(
        replaced_after >= Duration::from_millis(1700),
        "re-placed after {replaced_after:?}"
    );
    assert!(wait_until(T, || jobs(&a)[&jid]["state"] == "finished"));
    // B, resumed, never starts it: its lease expired (or A refuses the start grant).
    assert!(
        wait_until(T, || jobs(&b)
            .get(&jid)
            .is_some_and(|x| x["state"] == "cancelled")),
        "{:#?}",
        jobs(&b).get(&jid)
    );
    let sites = [&a, &b, &c];
    wait_events(&sites, std::slice::from_ref(&jid));
    let ran = exactly_once(&sites, std::slice::from_ref(&jid));
    assert_eq!(ran[&jid], "A");
    // B's own job is unaffected and A later sees B again.
    assert!(wait_until(T, || jobs(&b)[&bid[0]]["state"] == "finished"));
    wait_eligible(&a, &["B"]);
    eprintln!("J re-placed at A {replaced_after:?} after B stopped");
}

#[test]
fn mtls_sessions_need_a_certificate_naming_the_site_and_outsiders_get_summaries_only() {
    let tmp = tempdir();
    let d = tmp.path();
    make_certs(
        d,
        &["ca"],
        &[
            ("ca", "A", "siteA"),
            ("ca", "B", "siteB"),
            ("ca", "mallory", "siteM"),
            ("ca", "outsider", "outside"),
        ],
    );
    let ds = d.to_str().unwrap();
    let tls = |name: &str| -> Vec<String> {
        vec![
            "--tls-ca".into(),
            format!("{ds}/ca/ca.pem"),
            "--tls-cert".into(),
            format!("{ds}/certs/{name}.pem"),
            "--tls-key".into(),
            format!("{ds}/certs/{name}.key"),
            "--tls-client-ca".into(),
            format!("{ds}/ca/ca.pem"),
        ]
    };
    let start = |args: &[&str], who: &str, marker: &str| {
        let mut all: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        all.extend(tls(who));
        let refs: Vec<&str> = all.iter().map(String::as_str).collect();
        Proc::start(&refs, marker)
    };
    let policy = d.join("policy.toml");
    std::fs::write(
        &policy,
        "default = \"deny\"\n\
         [[rule]]\ncn = \"B\"\nactions = [\"*\"]\neffect = \"allow\"\n\
         [[rule]]\ncn = \"A\"\nactions = [\"federation\"]\neffect = \"allow\"\n\
         [[rule]]\ncn = \"mallory\"\nactions = [\"federation\"]\neffect = \"allow\"\n\
         [[rule]]\norg = \"outside\"\nactions = [\"producer.subscribe\", \"producer.query\"]\nresources = [\"site.summary\"]\neffect = \"allow\"\n",
    )
    .unwrap();
    let pol = policy.to_str().unwrap();
    // Site B: directory, hosts, endpoint, every one over mTLS; the producers enforce the policy.
    let bdir = start(
        &[
            "directory",
            "--listen",
            "127.0.0.1:0",
            "--data",
            &format!("{ds}/bdir"),
        ],
        "B",
        "gma directory listening on",
    );
    let sim_file = d.join("b-sim.toml");
    std::fs::write(&sim_file, hosts_toml(&[("b1", 4, 4)])).unwrap();
    let bsim = start(
        &[
            "producer",
            "--listen",
            "127.0.0.1:0",
            "--directory",
            &bdir.addr,
            "--no-host-sensors",
            "--simulate",
            sim_file.to_str().unwrap(),
            "--access-policy",
            pol,
        ],
        "B",
        "gma producer listening on",
    );
    let write = |name: &str, text: String| {
        let p = d.join(name);
        std::fs::write(&p, text).unwrap();
        p.to_str().unwrap().to_string()
    };
    let bcfg = write("b.toml", fed_toml("B", ""));
    let bfed = start(
        &[
            "federation",
            "--config",
            &bcfg,
            "--directory",
            &bdir.addr,
            "--access-policy",
            pol,
        ],
        "B",
        "gma federation listening on",
    );
    // Site A (no hosts, no directory: its links come from its config).
    let acfg = write(
        "a.toml",
        fed_toml(
            "A",
            &format!(
                "[[peer]]\nsite = \"B\"\nendpoint = \"{}\"\nrole = \"peer\"\n",
                bfed.addr
            ),
        ),
    );
    let afed = start(
        &["federation", "--config", &acfg],
        "A",
        "gma federation listening on",
    );
    // Mallory holds a certificate of the same CA but claims to be A.
    let mcfg = write(
        "m.toml",
        fed_toml(
            "A",
            &format!(
                "[[peer]]\nsite = \"B\"\nendpoint = \"{}\"\nrole = \"peer\"\n",
                bfed.addr
            ),
        ),
    );
    let mfed = start(
        &["federation", "--config", &mcfg],
        "mallory",
        "gma federation listening on",
    );
    let r = gma(
        &[
            "federation",
            "add",
            "--directory",
            &bdir.addr,
            "--site",
            "A",
            "--endpoint",
            &afed.addr,
            "--tls-ca",
            &format!("{ds}/ca/ca.pem"),
            "--tls-cert",
            &format!("{ds}/certs/B.pem"),
            "--tls-key",
            &format!("{ds}/certs/B.key"),
        ],
        T,
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    let status_as = |who: &str, addr: &str| -> Result<Value, String> {
        let mut args: Vec<String> = ["federation", "status", "--federation", addr, "--output", "json"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        args.extend(tls(who).into_iter().take(6));
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let r = gma(&refs, T);
        if r.code == 0 {
            Ok(serde_json::from_str(&r.stdout).unwrap())
        } else {
            Err(r.stderr)
        }
    };
    let peer_of = |v: &Value, site: &str| {
        v["peers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["site"] == site)
            .cloned()
    };
    // The genuine A has a session with B; mallory's is refused: its CN is not the site it claims.
    assert!(wait_until(T, || status_as("A", &afed.addr)
        .ok()
        .and_then(|v| peer_of(&v, "B"))
        .is_some_and(|p| p["eligible"] == true)));
    assert!(
        wait_until(T, || status_as("mallory", &mfed.addr)
            .ok()
            .and_then(|v| peer_of(&v, "B"))
            .is_some_and(|p| p["session"] == "refused"
                && p["last_error"].as_str().unwrap().contains("PermissionDenied")
                && p["last_error"].as_str().unwrap().contains("CN=mallory"))),
        "{:?}",
        status_as("mallory", &mfed.addr)
    );
    // The outsider: host.* is denied at B's producer, site.summary is served by B's endpoint.
    let outsider: Vec<String> = tls("outsider").into_iter().take(6).collect();
    let run_as = |args: &[&str]| {
        let mut all: Vec<&str> = args.to_vec();
        all.extend(outsider.iter().map(String::as_str));
        gma(&all, T)
    };
    let r = run_as(&["subscribe", "host.load", "--producer", &bsim.addr, "--count", "1"]);
    assert_eq!(r.code, 1);
    assert!(
        r.stderr.contains("PermissionDenied") || r.stderr.contains("may not"),
        "{}",
        r.stderr
    );
    let r = run_as(&[
        "subscribe",
        "site.summary",
        "--producer",
        &bfed.addr,
        "--count",
        "1",
        "--output",
        "json",
    ]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let ev = &json_lines(&r.stdout)[0];
    assert_eq!(
        (ev["name"].as_str(), ev["source"].as_str()),
        (Some("site.summary"), Some("B"))
    );
    assert_eq!(ev["values"]["cpus_total"], 4.0);
    // Nor may it submit jobs or read the federation status.
    let e = status_as("outsider", &bfed.addr).unwrap_err();
    assert!(e.contains("PermissionDenied"), "{e}");
    drop((bsim, bdir));
}
