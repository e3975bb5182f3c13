//! `gma broker provision` against a real `gma simres`: a shipped Montage-shaped workflow is
//! planned onto the manager's free capacity and the chosen plan reserved there; a plan the
//! manager refuses in part is released whole.

#![allow(clippy::unwrap_used)]

use gma_tests as common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::*;

const T: Duration = Duration::from_secs(120);

fn example(name: &str) -> String {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../examples/workflows")
        .join(name);
    p.to_str().unwrap().to_string()
}

/// (resource, cpus, start, end) of what `owner` holds at the manager.
fn held(manager: &str, owner: &str) -> BTreeSet<(String, u64, i64, i64)> {
    simres_reservations(manager, owner).iter().map(slot_of).collect()
}

fn slot_of(x: &serde_json::Value) -> (String, u64, i64, i64) {
    let cpus = x.get("cpus").or_else(|| x.get("processors"));
    (
        x["resource"].as_str().unwrap().to_string(),
        cpus.and_then(|c| c.as_u64()).unwrap(),
        x["start_s"].as_i64().unwrap(),
        x["end_s"].as_i64().unwrap(),
    )
}

/// `gma ARGS...`, which must succeed, printing one JSON value per line.
fn json_lines(args: &[&str]) -> Vec<serde_json::Value> {
    let r = gma(args, T);
    assert_eq!(r.code, 0, "{}", r.stderr);
    r.stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// `gma bench provision --part PART` at a small size (2 seeds, population 10, 2 generations).
fn bench_part(part: &str) -> Vec<serde_json::Value> {
    json_lines(&[
        "bench",
        "provision",
        "--part",
        part,
        "--seeds",
        "2",
        "--population",
        "10",
        "--generations",
        "2",
        "--output",
        "json",
    ])
}

/// `gma broker provision ARGS...`.
fn provision(args: &[&str]) -> Run {
    let mut all = vec!["broker", "provision"];
    all.extend_from_slice(args);
    gma(&all, T)
}

#[test]
fn a_montage_workflow_is_planned_on_simres_slots_and_the_chosen_plan_reserved() {
    let tmp = tempdir();
    // "small" is held by a background reservation for its first half hour.
    let m = start_simres(
        tmp.path(),
        "m",
        "horizon_s = 14400\n[[resource]]\nname = \"big\"\ncpus = 16\n\
         [[resource]]\nname = \"small\"\ncpus = 4\n[[resource.background]]\nstart_in_s = 0\nduration_s = 1800\n",
        &[],
    );
    let montage = example("montage-4.toml");
    let r = provision(&[
        "--workflow",
        &montage,
        "--alpha",
        "0.5",
        "--simres",
        &m.addr,
        "--slot-s",
        "900",
        "--resource-price",
        "big=2",
        "--reserve",
        "--owner",
        "prov",
        "--output",
        "json",
    ]);
    assert_eq!(r.code, 0, "{}\n{}", r.stdout, r.stderr);
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(
        (v["workflow"].as_str(), v["tasks"].as_u64()),
        (Some("montage-4"), Some(18))
    );
    let front = v["pareto"].as_array().unwrap();
    assert!(!front.is_empty(), "{v}");
    // The set is a front: by cost ascending, makespan strictly descending.
    for w in front.windows(2) {
        assert!(
            w[0]["cost_su"].as_f64().unwrap() < w[1]["cost_su"].as_f64().unwrap(),
            "{v}"
        );
        assert!(
            w[0]["makespan_s"].as_i64().unwrap() > w[1]["makespan_s"].as_i64().unwrap(),
            "{v}"
        );
    }
    let chosen = &v["chosen"];
    let want: BTreeSet<_> = chosen["slots"].as_array().unwrap().iter().map(slot_of).collect();
    assert!(!want.is_empty());
    // Exactly the chosen slots are held at the manager, by the owner given.
    assert_eq!(held(&m.addr, "prov"), want);
    assert_eq!(v["reservations"].as_array().unwrap().len(), want.len());
    // Every task is scheduled, mAdd on 8 processors.
    let sched = chosen["schedule"].as_array().unwrap();
    assert_eq!(sched.len(), 18);
    let add = sched.iter().find(|t| t["task"] == "mAdd").unwrap();
    let parts = add["parts"].as_array().unwrap();
    assert_eq!(
        parts
            .iter()
            .map(|p| p["processors"].as_u64().unwrap())
            .sum::<u64>(),
        8
    );
    // The manager publishes its free slots (rm.slots) on every change: in its newest snapshot
    // no slot offers processors that the plan holds.
    let events = json_lines(&[
        "query",
        "rm.slots",
        "--producer",
        &m.addr,
        "--since",
        "10m",
        "--output",
        "json",
    ]);
    let newest = events
        .iter()
        .map(|e| e["values"]["version"].as_f64().unwrap())
        .fold(0.0, f64::max);
    let snapshot: Vec<&serde_json::Value> = events
        .iter()
        .map(|e| &e["values"])
        .filter(|v| v["version"].as_f64() == Some(newest))
        .collect();
    assert_eq!(
        snapshot.len() as f64,
        snapshot[0]["count"].as_f64().unwrap(),
        "a whole snapshot"
    );
    for (res, cpus, a, b) in &want {
        let total = if res == "big" { 16 } else { 4 };
        for v in snapshot.iter().filter(|v| v["resource"] == res.as_str()) {
            let (s, e) = (v["start_s"].as_i64().unwrap(), v["end_s"].as_i64().unwrap());
            if s < *b && *a < e {
                assert!(
                    v["processors"].as_u64().unwrap() + cpus <= total,
                    "{v} over {res} {a}..{b}"
                );
            }
        }
    }
    // Planning again sees the reservations just made: the new offer leaves them out, so a
    // second plan reserves without a collision.
    let r = provision(&[
        "--workflow",
        &montage,
        "--alpha",
        "1",
        "--simres",
        &m.addr,
        "--slot-s",
        "900",
        "--reserve",
        "--owner",
        "prov2",
    ]);
    assert_eq!(r.code, 0, "{}\n{}", r.stdout, r.stderr);
    assert!(r.stdout.contains("Pareto set of"), "{}", r.stdout);
    assert!(!held(&m.addr, "prov2").is_empty());
    assert_eq!(held(&m.addr, "prov"), want);
}

#[test]
fn a_plan_refused_in_part_is_released_whole_and_bad_files_are_named() {
    let tmp = tempdir();
    // "b" is held by the background for two hours: a slot offered on it cannot be reserved.
    let m = start_simres(
        tmp.path(),
        "m",
        "[[resource]]\nname = \"a\"\ncpus = 1\n\
         [[resource]]\nname = \"b\"\ncpus = 1\n[[resource.background]]\nstart_in_s = 0\nduration_s = 7200\n",
        &[],
    );
    // Two 3000-second tasks and two one-processor hour-long slots: the only feasible plan
    // takes both; "a" is granted first, "b" refused, so "a" must be released.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let start = now + 600;
    let slots = tmp.path().join("slots.toml");
    let slot = |r: &str| {
        format!(
            "[[slot]]\nresource = \"{r}\"\nstart_s = {start}\nduration_s = 3600\nprocessors = 1\nprice = 1\n"
        )
    };
    std::fs::write(&slots, slot("a") + &slot("b")).unwrap();
    let wf = tmp.path().join("wf.toml");
    let task = |id: &str, s: u32| format!("[[task]]\nid = \"{id}\"\nruntime_s = {s}\nprocessors = 1\n");
    std::fs::write(&wf, task("x", 3000) + &task("y", 3000)).unwrap();
    let (wf_s, slots_s) = (wf.to_str().unwrap(), slots.to_str().unwrap());
    let base = ["--workflow", wf_s, "--slots", slots_s];
    let with = |extra: &[&str]| provision(&[&base[..], extra].concat());
    let r = with(&[
        "--alpha",
        "0",
        "--simres",
        &m.addr,
        "--reserve",
        "--owner",
        "prov",
    ]);
    assert_eq!(r.code, 1, "{}\n{}", r.stdout, r.stderr);
    assert!(r.stderr.contains("slot-1 refused"), "{}", r.stderr);
    assert!(
        r.stderr
            .contains("the 1 reservations made for the plan were released"),
        "{}",
        r.stderr
    );
    assert!(held(&m.addr, "prov").is_empty());
    // Without --reserve the same plan is printed: both slots, makespan 3000 s from the
    // offer's start (now_s defaults to the earliest slot).
    let r = with(&["--alpha", "0", "--output", "json"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(v["chosen"]["makespan_s"], 3000);
    assert_eq!(v["chosen"]["slots"].as_array().unwrap().len(), 2);
    // An α outside [0, 1] and --reserve without a manager are refused before any work.
    let r = with(&["--alpha", "2"]);
    assert!(
        r.code != 0 && r.stderr.contains("--alpha must be within 0..=1"),
        "{}",
        r.stderr
    );
    let r = with(&["--alpha", "0", "--reserve"]);
    assert!(
        r.code != 0 && r.stderr.contains("--reserve needs the resource managers"),
        "{}",
        r.stderr
    );
    // A cyclic workflow is refused with the cycle named.
    std::fs::write(
        &wf,
        task("x", 1)
            + &task("y", 1)
            + "[[edge]]\nfrom = \"x\"\nto = \"y\"\n[[edge]]\nfrom = \"y\"\nto = \"x\"\n",
    )
    .unwrap();
    let r = with(&["--alpha", "0"]);
    assert_eq!(r.code, 1);
    assert!(
        r.stderr.contains("the workflow has a cycle: x -> y -> x"),
        "{}",
        r.stderr
    );
}

#[test]
fn the_synthetic_slot_experiment_prints_its_figures_for_the_papers_plan_and_ours() {
    let runs = bench_part("a");
    assert_eq!(runs.len(), 2, "{runs:?}");
    assert_eq!(
        (runs[0]["drop_unused"].as_bool(), runs[1]["drop_unused"].as_bool()),
        (Some(false), Some(true))
    );
    for v in &runs {
        assert_eq!(v["paper"]["feasible"], 1742);
        for run in v["runs"].as_array().unwrap() {
            let slots = run["slots"].as_u64().unwrap();
            assert!((60..=200).contains(&slots), "{run}");
            // At most population × (generations + 1) distinct plans.
            assert!(run["evaluations"].as_u64().unwrap() <= 30, "{run}");
            assert!(run["feasible"].as_u64().unwrap() <= run["evaluations"].as_u64().unwrap());
            assert!(run["pareto"].as_u64().unwrap() >= 1, "{run}");
        }
        assert_eq!(v["alpha_sweep"].as_array().unwrap().len(), 11);
    }
}

/// Whether every slot `v` (a `gma broker provision --output json` answer) offers leaves room
/// for what `owner`'s reservations `held` take of resources of `total` processors.
fn offer_excludes(
    v: &serde_json::Value,
    held: &BTreeSet<(String, u64, i64, i64)>,
    total: &dyn Fn(&str) -> u64,
) -> bool {
    v["offered"].as_array().unwrap().iter().all(|o| {
        let (res, cpus, s, e) = slot_of(o);
        let taken: u64 = held
            .iter()
            .filter(|(r, _, a, b)| *r == res && *a < e && s < *b)
            .map(|h| h.1)
            .sum();
        cpus + taken <= total(&res)
    })
}

/// Runs `plan` until it succeeds with an answer meeting `good`, which it returns; fails
/// naming `what` with the last output when it never does.
fn plan_until(
    plan: impl Fn() -> Run,
    good: impl Fn(&serde_json::Value) -> bool,
    what: &str,
) -> serde_json::Value {
    let mut last = None;
    let ok = wait_until(T, || {
        let r = plan();
        let done =
            r.code == 0 && serde_json::from_str::<serde_json::Value>(&r.stdout).is_ok_and(|v| good(&v));
        last = Some(r);
        done
    });
    let r = last.unwrap();
    assert!(ok, "{what}: {}\n{}", r.stdout, r.stderr);
    serde_json::from_str(&r.stdout).unwrap()
}

#[test]
fn the_broker_follows_the_slots_a_manager_publishes_and_plans_on_them() {
    let tmp = tempdir();
    let dir = Proc::directory(&tmp.path().join("dir"), "127.0.0.1:0");
    let t0 = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let m = start_simres(
        tmp.path(),
        "m",
        "horizon_s = 14400\nslot_s = 900\n[prices]\nbig = 2\n[[resource]]\nname = \"big\"\ncpus = 16\n\
         [[resource]]\nname = \"small\"\ncpus = 4\n[[resource.background]]\nstart_in_s = 0\nduration_s = 1800\n",
        &["--directory", &dir.addr],
    );
    let broker = Proc::start(
        &["broker", "--listen", "127.0.0.1:0", "--directory", &dir.addr],
        "gma broker listening on",
    );
    let montage = example("montage-4.toml");
    let through_broker = |extra: &[&str]| {
        let base = [
            "--workflow",
            montage.as_str(),
            "--broker",
            broker.addr.as_str(),
            "--output",
            "json",
        ];
        provision(&[&base[..], extra].concat())
    };
    // The manager published its snapshot when it started; the broker, started after it,
    // still gets it (its slot subscription starts from the oldest events held).
    let v = plan_until(
        || through_broker(&["--alpha", "0.5"]),
        |_| true,
        "the broker never held the manager's slots",
    );
    assert_eq!(v["offer"], "broker");
    let offered = v["offered"].as_array().unwrap();
    // What the manager offers: both resources, "small" only after its background block, at
    // the manager's prices.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    assert!(offered.iter().any(|o| o["resource"] == "big"), "{v}");
    for o in offered {
        let (res, cpus, s, e) = slot_of(o);
        assert!(e - s <= 900 && e <= now + 14_400, "{o}");
        match res.as_str() {
            "big" => assert_eq!((cpus, o["price"].as_f64()), (16, Some(2.0)), "{o}"),
            "small" => {
                assert_eq!((cpus, o["price"].as_f64()), (4, Some(1.0)), "{o}");
                assert!(s >= t0 + 1800, "offered during the background block: {o}");
            }
            _ => panic!("unknown resource {o}"),
        }
    }
    // Reserving the chosen plan: the addresses come with the offers (no --simres given).
    let r = through_broker(&["--alpha", "0.5", "--reserve", "--owner", "prov"]);
    assert_eq!(r.code, 0, "{}\n{}", r.stdout, r.stderr);
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    let want: BTreeSet<_> = v["chosen"]["slots"]
        .as_array()
        .unwrap()
        .iter()
        .map(slot_of)
        .collect();
    assert!(!want.is_empty());
    assert_eq!(held(&m.addr, "prov"), want);
    // The manager publishes a new snapshot; the broker follows it: its offer leaves the
    // reserved processors out.
    let total = |r: &str| if r == "big" { 16 } else { 4 };
    plan_until(
        || through_broker(&["--alpha", "1"]),
        |v| offer_excludes(v, &want, &total),
        "the broker's offer still holds reserved processors",
    );
    let r = through_broker(&["--alpha", "1", "--reserve", "--owner", "prov2"]);
    assert_eq!(r.code, 0, "{}\n{}", r.stdout, r.stderr);
    assert!(!held(&m.addr, "prov2").is_empty());
    assert_eq!(held(&m.addr, "prov"), want);
    // --slots and --broker are two offers: refused together.
    let r = provision(&[
        "--workflow",
        &montage,
        "--alpha",
        "0",
        "--broker",
        &broker.addr,
        "--slots",
        &montage,
    ]);
    assert!(
        r.code != 0 && r.stderr.contains("cannot be used with"),
        "{}",
        r.stderr
    );
    drop(broker);
    drop(m);
}

#[test]
fn provisioned_and_best_effort_execution_print_their_figures_across_alpha() {
    let out = bench_part("b");
    let names: Vec<_> = out.iter().map(|v| v["workflow"].as_str().unwrap()).collect();
    assert_eq!(names, ["montage-4", "montage-25"]);
    for v in &out {
        assert_eq!(v["part"], "b");
        let work = v["best_effort"]["cost_su"].as_f64().unwrap();
        assert!(work > 0.0, "{v}");
        assert!(v["best_effort"]["makespan_mean_s"].as_f64().unwrap() > 0.0, "{v}");
        let rows = v["provisioned"].as_array().unwrap();
        let alphas: Vec<f64> = rows.iter().map(|r| r["alpha"].as_f64().unwrap()).collect();
        assert_eq!(alphas, [0.0, 0.25, 0.5, 0.75, 1.0]);
        for r in rows {
            assert_eq!(r["runs"], 2, "{v}");
            let cost = r["cost_mean_su"].as_f64().unwrap();
            // Charged for what the schedule uses, a plan never costs less than the work.
            assert!(cost >= work - 0.002, "{r} below the work {work}");
            assert!(r["whole_mean_su"].as_f64().unwrap() >= cost - 0.002, "{r}");
            assert!(r["faster_than_best_effort"].as_u64().unwrap() <= 2);
        }
        assert_eq!(v["trials"].as_array().unwrap().len(), 2);
    }
}
