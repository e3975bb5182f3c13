use std::cell::Cell;

use proptest::prelude::*;

use super::*;

const S: i64 = 1_000_000_000;

fn spec(name: &str, hosts: u32, cpus: u32) -> SiteSpec {
    let mut p = Params::new(name);
    p.rank.max_age_ms = u64::MAX / 4;
    p.heartbeat_ms = 2_000;
    p.origin_lease_ms = 30_000;
    p.summary_interval_ms = 5_000;
    p.push_debounce_ms = 0;
    p.valid_for_ms = 15_000;
    SiteSpec {
        params: p,
        hosts,
        cpus_per_host: cpus,
    }
}

fn job(name: &str, cpus: u32, secs: f64) -> Job {
    Job {
        name: name.into(),
        cpus,
        reference_time_s: secs,
        ..Job::default()
    }
}

/// Every job started exactly once and finished exactly once, where it ran.
fn exactly_once(w: &World) {
    for (id, evs) in w.by_job() {
        assert_eq!(w.count(&id, "started"), 1, "{id}: {evs:#?}");
        assert_eq!(w.count(&id, "finished"), 1, "{id}: {evs:#?}");
    }
}

#[test]
fn imbalance_forwards_and_every_job_completes() {
    let mut w = World::new(
        vec![spec("a", 1, 4), spec("b", 4, 4), spec("c", 4, 4)],
        &[("a", "b"), ("a", "c"), ("b", "c")],
    );
    w.run_until(T0 + S);
    for k in 0..10 {
        w.submit_at(T0 + S + k, "a", job(&format!("j{k}"), 4, 3600.0));
    }
    w.run_until(T0 + 6 * 3600 * S);
    assert_eq!(w.by_job().len(), 10);
    exactly_once(&w);
    let forwarded = w.log.iter().filter(|e| e.state == "forwarded").count();
    assert!(
        forwarded >= 7,
        "the idle sites took the overflow: {forwarded} forwarded"
    );
    // Nobody waited an hour: 1 + 4 + 4 hosts for 10 jobs, only one wave.
    let last = w
        .log
        .iter()
        .filter(|e| e.state == "finished")
        .map(|e| e.timestamp_ns)
        .max()
        .unwrap();
    assert!(last - T0 < 2 * 3600 * S + 10 * S, "{}", (last - T0) / S);
}

#[test]
fn a_ring_of_saturated_sites_forwards_no_job_twice_and_runs_each_once() {
    let mut w = World::new(
        vec![spec("a", 2, 4), spec("b", 2, 4), spec("c", 2, 4)],
        &[("a", "b"), ("b", "c"), ("c", "a")],
    );
    w.run_until(T0 + S);
    for site in ["a", "b", "c"] {
        for k in 0..12 {
            let secs = if site == "a" { 600.0 } else { 3600.0 };
            w.submit_at(T0 + S + k, site, job(&format!("{site}{k}"), 2, secs));
        }
    }
    w.run_until(T0 + 24 * 3600 * S);
    assert_eq!(w.by_job().len(), 36);
    exactly_once(&w);
    for (id, evs) in w.by_job() {
        let fwd = evs.iter().filter(|e| e.state == "forwarded").count();
        assert!(fwd <= 1, "{id} forwarded {fwd} times");
        assert!(evs.iter().all(|e| e.hops <= 1), "{id}: {evs:#?}");
    }
}

/// Site b holds a job a forwarded to it (b is busy), then the link is cut.
fn partitioned(heal_after_s: i64) -> World {
    let mut w = World::new(vec![spec("a", 1, 4), spec("b", 1, 4)], &[("a", "b")]);
    w.heartbeats(2 * S);
    w.run_until(T0 + S);
    w.submit_at(T0 + S, "a", job("busy-a", 4, 1000.0));
    w.submit_at(T0 + S, "b", job("busy-b", 4, 200.0));
    w.submit_pinned_at(T0 + 2 * S, "a", job("j", 4, 100.0), "b");
    w.run_until(T0 + 5 * S);
    let j = w.site("a").jobs().find(|j| j.job.name == "j").unwrap().id.clone();
    assert_eq!(w.site("b").job(&j).unwrap().state, crate::site::JobState::Queued);
    w.cut("a", "b");
    w.run_until(T0 + 5 * S + heal_after_s * S);
    w.heal();
    w.run_until(T0 + 4000 * S);
    w
}

#[test]
fn a_partition_while_a_forwarded_job_is_queued_ends_with_it_run_once() {
    // Cut for 60 s: b cancels it after the 30 s lease, a re-places it after 34 s; it runs at a.
    let w = partitioned(60);
    exactly_once(&w);
    let j = w.site("a").jobs().find(|j| j.job.name == "j").unwrap();
    let evs = &w.by_job()[&j.id];
    let cancel = evs
        .iter()
        .find(|e| e.site == "b" && e.state == "cancelled")
        .expect("b cancelled it");
    let requeue = evs
        .iter()
        .find(|e| e.site == "a" && e.state == "queued")
        .expect("a re-placed it");
    assert!(cancel.reason.contains("lease"), "{cancel:?}");
    assert!(
        requeue.timestamp_ns - (T0 + 5 * S) >= 34 * S,
        "re-placed only after lease + 2 heartbeats"
    );
    let start = evs
        .iter()
        .find(|e| e.state == "started" && e.site == e.current_site)
        .unwrap();
    assert_eq!(start.site, "a");
    // A short cut: the lease holds, b runs it once its own job ends.
    let w = partitioned(5);
    exactly_once(&w);
    let j = w.site("a").jobs().find(|j| j.job.name == "j").unwrap();
    let evs = &w.by_job()[&j.id];
    let start = evs
        .iter()
        .find(|e| e.state == "started" && e.site == e.current_site)
        .unwrap();
    assert_eq!(start.site, "b");
}

/// One step of a random partition scenario: jobs submitted now, the time to the next step,
/// and the partitions of the network at its end.
#[derive(Debug, Clone)]
struct Step {
    /// (site, CPUs, reference time, pinned to another site 1 in 5 (ignored when it is the same site)).
    jobs: Vec<(usize, u32, f64, Option<usize>)>,
    dt_s: i64,
    /// A cut between two sites, 15 in 100 (none when both are the same site).
    cut: Option<(usize, usize)>,
    /// A heal of every cut, 1 in 10.
    heal: bool,
}

fn step() -> impl Strategy<Value = Step> {
    (
        prop::collection::vec(
            (
                0..3usize,
                1..=4u32,
                10.0..400.0f64,
                prop::option::weighted(0.2, 0..3usize),
            ),
            0..4,
        ),
        1..40i64,
        prop::option::weighted(0.15, (0..3usize, 0..3usize)),
        prop::bool::weighted(0.1),
    )
        .prop_map(|(jobs, dt_s, cut, heal)| Step {
            jobs,
            dt_s,
            cut,
            heal,
        })
}

#[test]
fn property_random_partitions_never_run_a_job_twice_nor_lose_one() {
    let (leases, replaced, forwarded) = (Cell::new(0), Cell::new(0), Cell::new(0));
    // 100 to 200 steps of 20 s on average: the 1800 s of the scenario ends first but for the
    // shortest step lists, to which a failure shrinks.
    let config = ProptestConfig {
        cases: 10,
        // A case runs for a second or two: shrink a failure for at most two minutes (the
        // test's deadline in .config/nextest.toml is five).
        max_shrink_iters: 10_000,
        max_shrink_time: 120_000,
        ..ProptestConfig::default()
    };
    proptest!(config, |(steps in prop::collection::vec(step(), 100..=200))| {
        let names = ["a", "b", "c"];
        let mut w = World::new(
            vec![spec("a", 2, 4), spec("b", 2, 4), spec("c", 2, 4)],
            &[("a", "b"), ("b", "c"), ("c", "a")],
        );
        w.heartbeats(2 * S);
        let mut n = 0;
        let mut t = T0 + S;
        for st in &steps {
            if t >= T0 + 1800 * S {
                break;
            }
            for &(site, cpus, secs, pinned) in &st.jobs {
                let j = job(&format!("j{n}"), cpus, secs);
                n += 1;
                match pinned {
                    Some(to) if to != site => w.submit_pinned_at(t, names[site], j, names[to]),
                    _ => w.submit_at(t, names[site], j),
                }
            }
            t += st.dt_s * S;
            w.run_until(t);
            if let Some((x, y)) = st.cut {
                if x != y {
                    w.cut(names[x], names[y]);
                }
            }
            if st.heal {
                w.heal();
            }
        }
        w.heal();
        w.run_until(T0 + 8_000 * S);
        prop_assert_eq!(w.by_job().len(), n);
        leases.set(
            leases.get()
                + w.log
                    .iter()
                    .filter(|e| e.state == "cancelled" && e.reason.contains("lease"))
                    .count(),
        );
        replaced.set(
            replaced.get()
                + w.log
                    .iter()
                    .filter(|e| e.state == "queued" && e.reason.contains("re-placed"))
                    .count(),
        );
        forwarded.set(forwarded.get() + w.log.iter().filter(|e| e.state == "forwarded").count());
        for (id, evs) in w.by_job() {
            let starts = w.count(&id, "started");
            prop_assert!(starts <= 1, "{} started {} times: {:#?}", id, starts, evs);
            let finished = w.count(&id, "finished");
            prop_assert_eq!(finished, 1, "{} never finished: {:#?}", id, evs);
        }
    });
    let (leases, replaced, forwarded) = (leases.get(), replaced.get(), forwarded.get());
    eprintln!("{forwarded} forwards, {leases} lease cancellations, {replaced} re-placements");
    assert!(
        forwarded > 50 && leases > 0 && replaced > 0,
        "partitions must hit forwarded jobs"
    );
}

#[test]
fn the_benchmark_scenario_runs_both_ways() {
    let sc = Scenario {
        jobs_per_site: 150,
        ..Scenario::default()
    };
    let fed = run_scenario(&sc, true);
    let local = run_scenario(&sc, false);
    assert_eq!(fed.jobs, 450);
    assert_eq!((fed.finished, local.finished), (450, 450));
    assert_eq!(fed.started_twice, 0);
    assert_eq!(local.forwarded, 0);
    assert!(fed.forwarded > 0);
    assert!(
        fed.mean_completion_s < local.mean_completion_s,
        "{fed:?} vs {local:?}"
    );
}
