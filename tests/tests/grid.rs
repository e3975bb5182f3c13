//! The grid with real processes: a hierarchy of seven federation endpoints over three levels,
//! each site its own process group (a directory, a producer of simulated hosts, an endpoint),
//! linked parent/child with `gma federation add`:
//!
//! ```text
//!              R (r-x, r-arm)
//!          /                  \
//!     A (a-x)                  B (b-x)
//!    /        \               /        \
//! A1 (a1-x,   A2 (a2-x,    B1 (b1-x)   B2 (b2-x,
//!     a1-busy)    a2-arm)                  b2-sparc)
//! ```
//!
//! Every `*-x` host is x86_64 with 4 CPUs free; `a1-busy` has none free; `*-arm` are aarch64,
//! `b2-sparc` sparc64. Queries (`gma grid query`) check the level semantics of
//! docs/federation.md exactly: what each level returns, that a query goes up only from a
//! subtree without a match, that each resource comes once with its managing endpoint, and that
//! an echo through a second parent link is answered empty. Then a host is reserved through the
//! endpoint that manages it (`gma grid reserve`): the reservation number comes back, a second
//! exclusive request for the same host and time is refused with RESOURCE_EXHAUSTED, the host no
//! longer matches queries, and the reservation starts its job there and is released.

#![allow(clippy::unwrap_used)]

use gma_tests as common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::{Duration, Instant};

use common::fedsite::{add, link, start_site, start_site_with, wait_live, Site};
use common::*;
use serde_json::{json, Value};

const T: Duration = Duration::from_secs(30);
/// Waits paced by the job and query stream (two `gma` processes per round, slow on a loaded
/// 2-core machine).
const STREAM: Duration = Duration::from_secs(120);

/// `gma federation tree --output json` from `s`.
fn tree(s: &Site) -> Option<Value> {
    let r = gma(
        &[
            "federation",
            "tree",
            "--federation",
            &s.fed.addr,
            "--output",
            "json",
        ],
        T,
    );
    (r.code == 0).then(|| serde_json::from_str(&r.stdout).ok())?
}

/// site -> free CPUs of its subtree, over a tree's nodes (only those walked, not advertised).
fn subtrees(n: &Value) -> Value {
    let mut out = serde_json::Map::new();
    fn visit(n: &Value, out: &mut serde_json::Map<String, Value>) {
        if n["subtree_source"] == "walked" {
            let site = n["site"].as_str().unwrap_or_default().to_string();
            out.insert(site, n["subtree_cpus_free"].clone());
        }
        for c in n["inferiors"].as_array().into_iter().flatten() {
            visit(c, out);
        }
    }
    visit(n, &mut out);
    Value::Object(out)
}

fn write_req(tmp: &Path, name: &str, cpus: u32, arch: &str) -> String {
    let p = tmp.join(format!("{name}.toml"));
    std::fs::write(
        &p,
        format!(
            "name = \"{name}\"\ncpus = {cpus}\narch = \"{arch}\"\nmemory_mb = 1024\nreference_time_s = 600\n"
        ),
    )
    .unwrap();
    p.to_str().unwrap().to_string()
}

fn query(s: &Site, req: &str, levels: Option<u32>) -> Value {
    let mut args = vec![
        "grid",
        "query",
        "--requirements",
        req,
        "--federation",
        &s.fed.addr,
        "--output",
        "json",
    ];
    let l = levels.map(|l| l.to_string());
    if let Some(l) = &l {
        args.extend(["--levels", l]);
    }
    let r = gma(&args, T);
    assert_eq!(r.code, 0, "{}", r.stderr);
    serde_json::from_str(&r.stdout).unwrap()
}

/// The hosts of an answer, in its order (duplicates kept: the test looks for them).
fn hosts(a: &Value) -> Vec<String> {
    a["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["host"].as_str().unwrap().to_string())
        .collect()
}

fn strings(a: &Value, key: &str) -> Vec<String> {
    a[key]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_str().unwrap().to_string())
        .collect()
}

fn set(xs: &[&str]) -> BTreeSet<String> {
    xs.iter().map(|s| s.to_string()).collect()
}

/// Asserts an answer holds exactly `want` (each once), reached no further than it should,
/// escalated exactly `up`, and every manager answered.
fn expect(a: &Value, want: &[&str], up: &[&str], what: &str) {
    let got = hosts(a);
    let unique: BTreeSet<String> = got.iter().cloned().collect();
    assert_eq!(got.len(), unique.len(), "{what}: a host answered twice: {a:#}");
    assert_eq!(unique, set(want), "{what}: {a:#}");
    assert_eq!(strings(a, "escalations"), up, "{what}: {a:#}");
    assert!(strings(a, "unreached").is_empty(), "{what}: {a:#}");
    let answered = strings(a, "answered");
    let distinct: BTreeSet<&String> = answered.iter().collect();
    assert_eq!(
        answered.len(),
        distinct.len(),
        "{what}: a manager answered twice: {a:#}"
    );
}

#[test]
fn a_tree_of_seven_endpoints_answers_by_levels_and_reserves_through_the_owner() {
    let tmp = tempdir();
    let t = tmp.path();
    let r = start_site(t, "R", &[("r-x", "x86_64", 4), ("r-arm", "aarch64", 4)]);
    let a = start_site(t, "A", &[("a-x", "x86_64", 4)]);
    let b = start_site(t, "B", &[("b-x", "x86_64", 4)]);
    let a1 = start_site(t, "A1", &[("a1-x", "x86_64", 4), ("a1-busy", "x86_64", 0)]);
    let a2 = start_site(t, "A2", &[("a2-x", "x86_64", 4), ("a2-arm", "aarch64", 4)]);
    let b1 = start_site(t, "B1", &[("b1-x", "x86_64", 4)]);
    let b2 = start_site(t, "B2", &[("b2-x", "x86_64", 4), ("b2-sparc", "sparc64", 4)]);
    link(&r, &a);
    link(&r, &b);
    link(&a, &a1);
    link(&a, &a2);
    link(&b, &b1);
    link(&b, &b2);
    wait_live(&r, &["A", "B"]);
    wait_live(&a, &["R", "A1", "A2"]);
    wait_live(&b, &["R", "B1", "B2"]);
    for s in [&a1, &a2] {
        wait_live(s, &["A"]);
    }
    for s in [&b1, &b2] {
        wait_live(s, &["B"]);
    }
    let x86 = write_req(t, "x86", 2, "x86_64");
    let arm = write_req(t, "arm", 2, "aarch64");
    let sparc = write_req(t, "sparc", 2, "sparc64");
    // Every endpoint sees its own hosts (the simulated producers are up).
    let all = [&r, &a, &b, &a1, &a2, &b1, &b2];
    for s in all {
        let own = format!("{}-x", s.name.to_lowercase());
        assert!(
            wait_until(T, || hosts(&query(s, &x86, Some(0))) == [own.clone()]),
            "{} never matched its own host: {:#}",
            s.name,
            query(s, &x86, Some(0))
        );
    }

    // The tree (`gma federation tree`) from R, two levels down, with the free CPUs per subtree
    // from the summaries (R 8 own, A 4 + A1 4 + A2 8, B 4 + B1 4 + B2 8), and from A: its
    // superior R above it.
    let want_r = json!({"R": 40, "A": 16, "B": 16, "A1": 4, "A2": 8, "B1": 4, "B2": 8});
    assert!(
        wait_until(T, || tree(&r).is_some_and(|v| subtrees(&v["root"]) == want_r)),
        "the tree from R never showed every subtree's free CPUs {want_r}: {:?}",
        tree(&r)
    );
    let from_a = tree(&a).unwrap();
    assert_eq!(from_a["superiors"][0]["site"], "R", "{from_a:#}");
    assert_eq!(from_a["superiors"].as_array().map(Vec::len), Some(1));
    assert_eq!(from_a["root"]["own_cpus_free"], 4, "{from_a:#}");
    for i in from_a["root"]["inferiors"].as_array().unwrap() {
        assert_eq!(i["link"]["live"], true, "{from_a:#}");
        assert!(i["link"]["heard_ms_ago"].is_u64(), "{from_a:#}");
    }
    let text = gma(
        &[
            "federation",
            "tree",
            "--federation",
            &a.fed.addr,
            "--output",
            "text",
        ],
        T,
    );
    assert_eq!(text.code, 0, "{}", text.stderr);
    let lines: Vec<&str> = text.stdout.lines().collect();
    assert_eq!(lines.len(), 4, "{}", text.stdout);
    assert!(lines[0].starts_with("^ R "), "{}", text.stdout);
    assert!(
        lines[1].contains("A ") && lines[1].contains("subtree 16 free CPUs"),
        "{}",
        text.stdout
    );

    // Levels 0: the manager asked, alone; the busy host never matches.
    let q = query(&a1, &x86, Some(0));
    expect(&q, &["a1-x"], &[], "A1 levels 0");
    assert_eq!(strings(&q, "answered"), ["A1"]);
    let res = &q["resources"][0];
    assert_eq!(
        (res["site"].as_str(), res["endpoint"].as_str()),
        (Some("A1"), Some(a1.fed.addr.as_str()))
    );
    // Levels 1: it and its children; a match below means no escalation.
    let q = query(&a, &x86, Some(1));
    expect(&q, &["a-x", "a1-x", "a2-x"], &[], "A levels 1");
    assert_eq!(
        strings(&q, "answered").into_iter().collect::<BTreeSet<_>>(),
        set(&["A", "A1", "A2"])
    );
    let q = query(&r, &x86, Some(1));
    expect(&q, &["r-x", "a-x", "b-x"], &[], "R levels 1");
    // Unlimited from the root: every site's x86 host, each once, with its own endpoint.
    let q = query(&r, &x86, None);
    expect(
        &q,
        &["r-x", "a-x", "b-x", "a1-x", "a2-x", "b1-x", "b2-x"],
        &[],
        "R unlimited",
    );
    for res in q["resources"].as_array().unwrap() {
        let site = res["site"].as_str().unwrap();
        let owner = all.iter().find(|s| s.name == site).unwrap();
        assert_eq!(res["endpoint"].as_str(), Some(owner.fed.addr.as_str()), "{res}");
        assert_eq!(
            res["host"].as_str().unwrap(),
            format!("{}-x", site.to_lowercase())
        );
    }
    assert_eq!(q["resources"][6]["distance"], 2, "{q:#}");

    // Escalation only from a subtree without a match: A1 has no arm host and no children, so
    // the query goes up to A, whose other child A2 has one: it stops there (R's r-arm is not
    // asked for).
    expect(&query(&a1, &arm, None), &["a2-arm"], &["A1>A"], "arm from A1");
    // Asked at A, the subtree matches: no escalation at all.
    expect(&query(&a, &arm, None), &["a2-arm"], &[], "arm from A");
    // From B the subtree has none: up to R, which has one and also searches A's subtree.
    let q = query(&b, &arm, None);
    expect(&q, &["r-arm", "a2-arm"], &["B>R"], "arm from B");
    assert_eq!(
        (
            q["resources"][0]["distance"].as_u64(),
            q["resources"][1]["distance"].as_u64()
        ),
        (Some(1), Some(3))
    );
    // Levels bound the travel up and down: b2-sparc is 4 links from A1.
    expect(
        &query(&a1, &sparc, Some(1)),
        &[],
        &["A1>A"],
        "sparc from A1 levels 1",
    );
    expect(
        &query(&a1, &sparc, Some(3)),
        &[],
        &["A1>A", "A>R"],
        "sparc from A1 levels 3",
    );
    expect(
        &query(&a1, &sparc, Some(4)),
        &["b2-sparc"],
        &["A1>A", "A>R"],
        "sparc from A1 levels 4",
    );
    let q = query(&a1, &sparc, None);
    expect(&q, &["b2-sparc"], &["A1>A", "A>R"], "sparc from A1 unlimited");
    assert_eq!(q["resources"][0]["endpoint"].as_str(), Some(b2.fed.addr.as_str()));
    expect(&query(&a1, &sparc, Some(0)), &[], &[], "sparc from A1 levels 0");

    // Reserve through the owner: A2 manages a2-x.
    let job = write_req(t, "job", 2, "x86_64");
    let reserve = |host: &str, start: &str| {
        gma(
            &[
                "grid",
                "reserve",
                "--federation",
                &a2.fed.addr,
                "--host",
                host,
                "--job",
                &job,
                "--exclusive",
                "--start-s",
                start,
                "--duration-s",
                "600",
                "--output",
                "json",
            ],
            T,
        )
    };
    let first = reserve("a2-x", "0");
    assert_eq!(first.code, 0, "{}", first.stderr);
    let res: Value = serde_json::from_str(&first.stdout).unwrap();
    let number = res["number"].as_u64().unwrap();
    assert!(number >= 1, "{res}");
    assert_eq!(
        (res["site"].as_str(), res["host"].as_str(), res["cpus"].as_u64()),
        (Some("A2"), Some("a2-x"), Some(4))
    );
    assert_eq!(res["state"], "reserved");
    // The same host and time, exclusively, again: refused, precisely.
    let second = reserve("a2-x", "0");
    assert_ne!(second.code, 0, "{}", second.stdout);
    assert!(second.stderr.contains("ResourceExhausted"), "{}", second.stderr);
    // The reserved host no longer matches a query (its CPUs are promised) ...
    let q = query(&a, &x86, Some(1));
    expect(&q, &["a-x", "a1-x"], &[], "A levels 1 with a2-x reserved");
    // ... and a future time is decided by the calendar: once granted, then refused.
    let later = (std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        + 3_600)
        .to_string();
    let f1 = reserve("a2-x", &later);
    assert_eq!(f1.code, 0, "{}", f1.stderr);
    let f2 = reserve("a2-x", &later);
    assert!(
        f2.code != 0 && f2.stderr.contains("ResourceExhausted") && f2.stderr.contains("is reserved over"),
        "{}",
        f2.stderr
    );
    // An unknown host and a host of another site are not this endpoint's to reserve.
    let other = reserve("a1-x", "0");
    assert!(
        other.code != 0 && other.stderr.contains("NotFound"),
        "{}",
        other.stderr
    );

    // Start: the job runs on the reserved host, at the owner.
    let n = number.to_string();
    let s = gma(
        &[
            "grid",
            "start",
            &n,
            "--federation",
            &a2.fed.addr,
            "--output",
            "json",
        ],
        T,
    );
    assert_eq!(s.code, 0, "{}", s.stderr);
    let started: Value = serde_json::from_str(&s.stdout).unwrap();
    let job_id = started["job_id"].as_str().unwrap().to_string();
    assert!(job_id.starts_with("A2/"), "{started}");
    let again = gma(&["grid", "start", &n, "--federation", &a2.fed.addr], T);
    assert!(
        again.code != 0 && again.stderr.contains("FailedPrecondition"),
        "{}",
        again.stderr
    );
    let ran_on = || {
        let r = gma(
            &[
                "job",
                "status",
                &job_id,
                "--federation",
                &a2.fed.addr,
                "--output",
                "json",
            ],
            T,
        );
        serde_json::from_str::<Value>(&r.stdout).ok()
    };
    assert!(
        wait_until(T, || ran_on()
            .is_some_and(|j| j["state"] == "finished" && j["host"] == "a2-x")),
        "the reserved job did not run on a2-x: {:?}",
        ran_on()
    );
    // Release: once.
    let rel = gma(&["grid", "release", &n, "--federation", &a2.fed.addr], T);
    assert_eq!(rel.code, 0, "{}", rel.stderr);
    let rel = gma(&["grid", "release", &n, "--federation", &a2.fed.addr], T);
    assert!(rel.code != 0 && rel.stderr.contains("NotFound"), "{}", rel.stderr);

    // An echo: B1 also under A. From R, B1 is reached through A and through B; it answers
    // the second arrival empty, so its host comes once.
    link(&a, &b1);
    wait_live(&a, &["B1"]);
    wait_live(&b1, &["A", "B"]);
    let q = query(&r, &x86, None);
    let got = hosts(&q);
    let unique: BTreeSet<String> = got.iter().cloned().collect();
    assert_eq!(got.len(), unique.len(), "{q:#}");
    assert_eq!(
        unique,
        set(&["r-x", "a-x", "b-x", "a1-x", "a2-x", "b1-x", "b2-x"]),
        "{q:#}"
    );
    assert_eq!(q["duplicates"], 1, "{q:#}");
    assert!(strings(&q, "unreached").is_empty(), "{q:#}");
}

/// The sites a site has links with (`"live"` or not), by name.
fn peers(s: &Site) -> BTreeMap<String, bool> {
    federation_status(&s.fed.addr)
        .map(|v| {
            v["peers"]
                .as_array()
                .map(|ps| {
                    ps.iter()
                        .map(|p| {
                            (
                                p["site"].as_str().unwrap_or_default().to_string(),
                                p["live"] == true,
                            )
                        })
                        .collect()
                })
                .unwrap_or_default()
        })
        .unwrap_or_default()
}

/// `gma job list --output json` of a site, by job id.
fn jobs(s: &Site) -> BTreeMap<String, Value> {
    federation_jobs(&s.fed.addr)
}

/// A job file: 2 x86_64 CPUs for 1 s (time_scale 1/600).
fn job_file(t: &Path) -> String {
    let job = t.join("job.toml");
    std::fs::write(
        &job,
        "name = \"j\"\ncpus = 2\narch = \"x86_64\"\nmemory_mb = 1024\nreference_time_s = 600\n",
    )
    .unwrap();
    job.to_str().unwrap().to_string()
}

/// Until `s` has a live link with `to` and none with `from` (killed at `killed`); prints the
/// time from the kill (for reading; no threshold).
fn reattached(s: &Site, to: &str, from: &str, killed: Instant, how: &str) {
    assert!(
        wait_until(T, || {
            let p = peers(s);
            p.get(to) == Some(&true) && !p.contains_key(from)
        }),
        "{} never re-attached to {to}: {:?}\n{}",
        s.name,
        peers(s),
        s.fed.stderr_text()
    );
    eprintln!(
        "{} re-attached to {to} {} ms after kill -9 {from} (reattach_after_ms = 1000, {how})",
        s.name,
        killed.elapsed().as_millis()
    );
}

/// `gma subscribe` of each site's events from now on, returned once every subscription is
/// live: each has delivered an event (a `federation.status`, published every
/// `status_interval_ms`), so no `job.state` published from here on is missed (a subscriber
/// still connecting on a loaded machine would miss the first starts).
fn follow_states(sites: &[&Site]) -> Vec<Proc> {
    let subs: Vec<Proc> = sites
        .iter()
        .map(|s| {
            Proc::start(
                &["subscribe", "*", "--producer", &s.fed.addr, "--output", "json"],
                "",
            )
        })
        .collect();
    assert!(
        wait_until(T, || subs.iter().all(|p| !p.stdout_lines().is_empty())),
        "a subscription never delivered an event: {:?}",
        sites
            .iter()
            .zip(&subs)
            .map(|(s, p)| (&s.name, p.stdout_lines().len(), p.stderr_text()))
            .collect::<Vec<_>>()
    );
    subs
}

/// Every start the subscriptions saw (published by the site the job started at).
fn starts(subs: &[Proc]) -> Vec<Value> {
    subs.iter()
        .flat_map(|p| json_lines(&p.stdout_lines().join("\n")))
        .filter(|e| e["name"] == "job.state")
        .map(|e| e["values"].clone())
        .filter(|v| v["state"] == "started" && v["site"] == v["current"])
        .collect()
}

/// The sites where `id` started.
fn starts_of<'a>(started: &'a [Value], id: &str) -> Vec<&'a str> {
    started
        .iter()
        .filter(|v| v["job"] == id)
        .filter_map(|v| v["site"].as_str())
        .collect()
}

/// What the stream of jobs and queries saw.
#[derive(Default)]
struct Stream {
    /// Acknowledged job ids (the submit command printed them), with their origin.
    jobs: Vec<(String, String)>,
    /// Queries from the root: (when it was sent, exit code, stderr, hosts answered).
    queries: Vec<(Instant, i32, String, Vec<String>)>,
}

/// The middle manager A of the tree is killed (SIGKILL) while jobs are submitted at its
/// children A1 and A2 and the root answers queries without pause. A1 is configured with only
/// its parent A (it learns its grandparent R from A at runtime); A2 also configures the chain
/// `[[superior]] R`; both with `reattach_after_ms = 1000`. They must attach to R on their own,
/// R must accept them (and show them as its inferiors in `gma federation tree`), queries from R
/// must keep answering — every one after the move with A1's and A2's hosts — and every
/// acknowledged job id must end exactly once: finished after exactly one start, or — the only
/// other outcome allowed — started at A before A was killed (A's own, it died with it), then
/// started nowhere else. The time from the kill to each re-attachment is printed. Then A1
/// restarts: its links (R, not A, although A is its configured parent) survive in its state
/// file.
#[test]
fn a_killed_middle_manager_s_children_reattach_to_the_grandparent_without_losing_a_job() {
    let tmp = tempdir();
    let t = tmp.path();
    // One hop per job: a job forwarded to A runs at A or goes back to its origin.
    let common = "max_hops = 1\norigin_lease_ms = 1000\n";
    let r = start_site_with(t, "R", &[("r-x", "x86_64", 4)], common);
    let a = start_site_with(t, "A", &[("a-x", "x86_64", 4)], common);
    let b = start_site_with(t, "B", &[("b-x", "x86_64", 4)], common);
    // Each leaf also has an aarch64 host the (x86_64) jobs never use: what the queries find.
    let child = |name: &str, host: &str, arm: &str, configured_chain: bool| {
        let mut extra = format!(
            "{common}reattach_after_ms = 1000\n\
             [[peer]]\nsite = \"A\"\nendpoint = \"{}\"\nrole = \"parent\"\n",
            a.fed.addr
        );
        if configured_chain {
            extra.push_str(&format!(
                "[[superior]]\nsite = \"R\"\nendpoint = \"{}\"\ndirectory = \"{}\"\n",
                r.fed.addr, r.dir.addr
            ));
        }
        start_site_with(t, name, &[(host, "x86_64", 4), (arm, "aarch64", 4)], &extra)
    };
    let mut a1 = child("A1", "a1-x", "a1-arm", false);
    let a2 = child("A2", "a2-x", "a2-arm", true);
    let b1 = start_site_with(t, "B1", &[("b1-x", "x86_64", 4)], common);
    let b2 = start_site_with(t, "B2", &[("b2-x", "x86_64", 4)], common);
    link(&r, &a);
    link(&r, &b);
    add(&a, &a1, "child");
    add(&a, &a2, "child");
    link(&b, &b1);
    link(&b, &b2);
    wait_live(&r, &["A", "B"]);
    wait_live(&a, &["R", "A1", "A2"]);
    wait_live(&b, &["R", "B1", "B2"]);
    wait_live(&a1, &["A"]);
    wait_live(&a2, &["A"]);
    let arm = write_req(t, "arm", 2, "aarch64");
    let leaves = ["a1-arm", "a2-arm"];
    assert!(
        wait_until(T, || hosts(&query(&r, &arm, None))
            .into_iter()
            .collect::<BTreeSet<_>>()
            == set(&leaves)),
        "R never found the leaves' aarch64 hosts: {:#}",
        query(&r, &arm, None)
    );
    let subs = follow_states(&[&r, &a, &b, &a1, &a2, &b1, &b2]);
    // 2 CPUs for 1 s each, three at a time (`--count 3`) on a leaf's 4 free x86 CPUs: the third
    // goes to A, however slowly the stream runs (one job at a time filled the leaves only when
    // the next came within the second, which a loaded machine does not do).
    let job = job_file(t);

    let seen = std::sync::Arc::new(std::sync::Mutex::new(Stream::default()));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stream = {
        let (seen, stop, job, arm) = (seen.clone(), stop.clone(), job.clone(), arm.clone());
        let origins = [("A1", a1.fed.addr.clone()), ("A2", a2.fed.addr.clone())];
        let root = r.fed.addr.clone();
        std::thread::spawn(move || {
            let mut i = 0usize;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                let (origin, addr) = &origins[i % 2];
                i += 1;
                let s = gma(
                    &[
                        "job",
                        "submit",
                        "--job",
                        &job,
                        "--federation",
                        addr,
                        "--count",
                        "3",
                    ],
                    T,
                );
                // Each id is printed once its copy is acknowledged (also when a later copy
                // then fails).
                let mut g = seen.lock().unwrap();
                for id in s.stdout.lines().filter(|l| !l.trim().is_empty()) {
                    g.jobs.push((id.trim().to_string(), origin.to_string()));
                }
                drop(g);
                let sent = Instant::now();
                let q = gma(
                    &[
                        "grid",
                        "query",
                        "--requirements",
                        &arm,
                        "--federation",
                        &root,
                        "--output",
                        "json",
                    ],
                    T,
                );
                let found = serde_json::from_str::<Value>(&q.stdout)
                    .map(|v| hosts(&v))
                    .unwrap_or_default();
                seen.lock().unwrap().queries.push((sent, q.code, q.stderr, found));
            }
        })
    };
    let count = |origin: &str| {
        seen.lock()
            .unwrap()
            .jobs
            .iter()
            .filter(|(_, o)| o == origin)
            .count()
    };
    assert!(
        wait_until(STREAM, || count("A1") >= 6 && count("A2") >= 6),
        "the stream acknowledged too few jobs: {} at A1, {} at A2",
        count("A1"),
        count("A2")
    );
    // Jobs have been forwarded to A (the leaves have 4 CPUs each, every job 2 for 1 s).
    assert!(
        wait_until(T, || jobs(&a).values().any(|j| j["origin"] != "A")),
        "no job ever reached A: A holds {:?}; A1's jobs (id, state, site): {:?}",
        jobs(&a).keys().collect::<Vec<_>>(),
        jobs(&a1)
            .values()
            .map(|j| (j["id"].clone(), j["state"].clone(), j["site"].clone()))
            .collect::<Vec<_>>()
    );
    let mut a = a;
    let killed = Instant::now();
    a.fed.kill();
    let jobs_at_kill = seen.lock().unwrap().jobs.len();

    // A1 and A2 attach to R on their own (A1 knows R only from A); R accepts them; A is gone
    // from their links.
    reattached(&a1, "R", "A", killed, "R told by A");
    reattached(&a2, "R", "A", killed, "R configured");
    wait_live(&r, &["A1", "A2", "B"]);
    // R shows them as its inferiors.
    let inferiors = |v: &Value| -> BTreeSet<String> {
        v["inferiors"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|c| c["site"].as_str().map(String::from))
            .collect()
    };
    assert!(
        wait_until(T, || tree(&r).is_some_and(
            |v| set(&["A1", "A2", "B"]).is_subset(&inferiors(&v["root"]))
        )),
        "R's tree never listed A1 and A2 as its inferiors: {:#}",
        tree(&r).unwrap_or_default()
    );
    // Queries from the root find A1's and A2's hosts again, each once, through the new links.
    assert!(
        wait_until(T, || {
            let q = query(&r, &arm, None);
            hosts(&q).len() == 2 && hosts(&q).into_iter().collect::<BTreeSet<_>>() == set(&leaves)
        }),
        "R never found A1's and A2's hosts again: {:#}",
        query(&r, &arm, None)
    );
    let found_again = Instant::now();
    // The stream goes on after the move.
    let after_move = || {
        let g = seen.lock().unwrap();
        let queries = g.queries.iter().filter(|q| q.0 >= found_again).count();
        (g.jobs.len() - jobs_at_kill, queries)
    };
    assert!(
        wait_until(STREAM, || {
            let (jobs, queries) = after_move();
            jobs >= 6 && queries >= 5
        }),
        "the stream did not go on after the move (awaited 6 jobs acknowledged since the kill and 5 queries since R found A1's and A2's hosts again; seen (jobs, queries) = {:?})",
        after_move()
    );
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    stream.join().unwrap();
    let seen = std::mem::take(&mut *seen.lock().unwrap());
    // Queries kept answering throughout (the outage shows as an unreached A, not an error).
    let failed: Vec<_> = seen.queries.iter().filter(|q| q.1 != 0).collect();
    assert!(failed.is_empty(), "queries failed: {failed:?}");
    // Every query sent once R found the moved subtree again answers with its hosts, once each.
    let after: Vec<_> = seen.queries.iter().filter(|q| q.0 >= found_again).collect();
    assert!(!after.is_empty(), "no query was sent after the move");
    for q in &after {
        let mut got = q.3.clone();
        got.sort();
        assert_eq!(got, ["a1-arm", "a2-arm"], "a query after the move: {q:?}");
    }
    eprintln!(
        "{} queries from R, none failed; {} after the move, each with A1's and A2's hosts",
        seen.queries.len(),
        after.len()
    );

    // Every acknowledged job: finished at its origin, or — granted to start at A, whose link the
    // re-attachment removed — reported failed to its submitter (its outcome unknown), never
    // left hanging and never run a second time.
    let origin_of = |o: &str| if o == "A1" { &a1 } else { &a2 };
    let at_a = |j: &Value| {
        j["site"] == "A"
            && j["granted"] == true
            && j["state"] == "failed"
            && j["reason"]
                .as_str()
                .is_some_and(|r| r.contains("outcome is unknown"))
    };
    let settled = || {
        let (l1, l2) = (jobs(&a1), jobs(&a2));
        seen.jobs
            .iter()
            .filter(|(id, o)| {
                let j = if o == "A1" { l1.get(id) } else { l2.get(id) };
                !j.is_some_and(|j| j["state"] == "finished" || at_a(j))
            })
            .map(|(id, _)| id.clone())
            .collect::<Vec<_>>()
    };
    assert!(
        wait_until(Duration::from_secs(90), || settled().is_empty()),
        "jobs lost (acknowledged, neither finished nor reported failed after starting at A): {:?}",
        settled()
            .iter()
            .map(|id| {
                let o = &seen.jobs.iter().find(|(x, _)| x == id).unwrap().1;
                jobs(origin_of(o)).get(id).cloned()
            })
            .collect::<Vec<_>>()
    );
    // Exactly once, counted from every site's job.state events (A's until it died).
    let started = starts(&subs);
    let (mut finished, mut owned_by_a) = (0, 0);
    for (id, o) in &seen.jobs {
        let j = jobs(origin_of(o))[id].clone();
        let starts = starts_of(&started, id);
        if j["state"] == "finished" {
            finished += 1;
            assert_eq!(starts.len(), 1, "{id} started {starts:?}: {j}");
            assert_eq!(Some(starts[0]), j["site"].as_str(), "{id}: {j}");
        } else {
            owned_by_a += 1;
            assert!(starts.iter().all(|s| *s == "A"), "{id} started {starts:?}: {j}");
        }
    }
    assert!(finished > 0, "no job finished");
    eprintln!(
        "{} jobs: {finished} finished exactly once, {owned_by_a} started at A before it was killed and reported failed",
        seen.jobs.len()
    );

    // A1 restarts on the same address: its links come from its state file: R, not A (its
    // configured parent, removed at runtime).
    let addr = a1.fed.addr.clone();
    assert!(
        a1.fed.terminate().is_some_and(|s| s.success()),
        "{}",
        a1.fed.stderr_text()
    );
    let cfg = t.join("A1").join("fed.toml");
    a1.fed = Proc::start(
        &[
            "federation",
            "--listen",
            &addr,
            "--directory",
            &a1.dir.addr,
            "--config",
            cfg.to_str().unwrap(),
        ],
        "gma federation listening on",
    );
    assert!(
        wait_until(T, || {
            let p = peers(&a1);
            p.get("R") == Some(&true) && !p.contains_key("A")
        }),
        "A1's links after a restart: {:?}",
        peers(&a1)
    );
    wait_live(&r, &["A1"]);
    drop(b1);
    drop(b2);
    drop(b);
}

/// A job forwarded two hops, A → B → C, while B is killed (SIGKILL): C is the root, B its
/// child, A B's child configured with only its parent B (it learns C from B). A's one host
/// takes one job at a time, B has no free CPU (it passes A's jobs on to C), C has room. Jobs
/// are submitted at A without pause; once C holds jobs of A's that came through B, B is killed.
/// A re-attaches to C, and every job A acknowledged settles exactly once: finished after exactly
/// one start, or — started at C under B's grant, whose outcome A cannot learn once B's link is
/// gone — reported failed, started at most once. None is lost, none runs twice.
#[test]
fn a_job_forwarded_two_hops_through_a_manager_killed_mid_way_is_settled_once() {
    let tmp = tempdir();
    let t = tmp.path();
    let common = "max_hops = 2\norigin_lease_ms = 1000\nreattach_after_ms = 1000\n";
    let c = start_site_with(t, "C", &[("c-x", "x86_64", 4)], common);
    let b = start_site_with(t, "B", &[("b-x", "x86_64", 0)], common);
    let a = start_site_with(
        t,
        "A",
        &[("a-x", "x86_64", 2)],
        &format!(
            "{common}[[peer]]\nsite = \"B\"\nendpoint = \"{}\"\nrole = \"parent\"\n",
            b.fed.addr
        ),
    );
    link(&c, &b);
    add(&b, &a, "child");
    wait_live(&c, &["B"]);
    wait_live(&b, &["C", "A"]);
    wait_live(&a, &["B"]);
    let subs = follow_states(&[&a, &b, &c]);
    let job = job_file(t);
    let acked = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stream = {
        let (acked, stop, job, addr) = (acked.clone(), stop.clone(), job.clone(), a.fed.addr.clone());
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                let s = gma(&["job", "submit", "--job", &job, "--federation", &addr], T);
                if s.code == 0 {
                    let ids = s.stdout.lines().map(str::trim).filter(|l| !l.is_empty());
                    acked.lock().unwrap().extend(ids.map(String::from));
                }
            }
        })
    };
    // Jobs of A's reached C through B.
    let through_b = || {
        jobs(&c)
            .values()
            .filter(|j| j["origin"] == "A" && j["from"] == "B")
            .count()
    };
    assert!(
        wait_until(T, || through_b() >= 2),
        "no job of A's reached C through B: at B {:?}, at C {:?}",
        jobs(&b),
        jobs(&c)
    );
    let mut b = b;
    let killed = Instant::now();
    b.fed.kill();
    let at_kill = acked.lock().unwrap().len();
    reattached(&a, "C", "B", killed, "C told by B");
    assert!(
        wait_until(T, || acked.lock().unwrap().len() >= at_kill + 4),
        "no jobs were acknowledged after the move"
    );
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    stream.join().unwrap();
    let acked = std::mem::take(&mut *acked.lock().unwrap());
    let unknown = |j: &Value| {
        j["state"] == "failed"
            && j["reason"]
                .as_str()
                .is_some_and(|r| r.contains("outcome is unknown"))
    };
    let open = || {
        let l = jobs(&a);
        acked
            .iter()
            .filter(|id| !l.get(*id).is_some_and(|j| j["state"] == "finished" || unknown(j)))
            .cloned()
            .collect::<Vec<_>>()
    };
    assert!(
        wait_until(Duration::from_secs(90), || open().is_empty()),
        "jobs lost (acknowledged at A, neither finished nor reported failed): {:?}",
        open()
            .iter()
            .map(|id| (jobs(&a).get(id).cloned(), jobs(&c).get(id).cloned()))
            .collect::<Vec<_>>()
    );
    let started = starts(&subs);
    let (l, at_c) = (jobs(&a), jobs(&c));
    let (mut finished, mut failed, mut two_hops) = (0, 0, 0);
    for id in &acked {
        let j = &l[id];
        let at = starts_of(&started, id);
        if j["state"] == "finished" {
            finished += 1;
            assert_eq!(at.len(), 1, "{id} started {at:?}: {j}");
            assert_eq!(Some(at[0]), j["site"].as_str(), "{id}: {j}");
        } else {
            failed += 1;
            assert!(at.len() <= 1, "{id} started {at:?}: {j}");
        }
        if at == ["C"] && at_c.get(id).is_some_and(|j| j["from"] == "B") {
            two_hops += 1;
        }
    }
    assert!(finished > 0, "no job finished");
    assert!(two_hops > 0, "no job ran at C through B");
    eprintln!(
        "{} jobs at A: {finished} finished exactly once, {failed} reported failed (started at most once), {two_hops} ran at C through B",
        acked.len()
    );
}
