use proptest::prelude::*;

use super::*;
use crate::utility::{Interval, Operator, Requirement, UserClass};

const NOW: i64 = 1_000_000_000_000;

fn host(name: &str, cpus: f64, free: f64, queue: f64, specint: f64) -> Resource {
    let mut r = Resource::unknown(name);
    r.total_cpus = cpus;
    r.free_cpus = free;
    r.queue_waiting = queue;
    r.load1 = cpus - free;
    r.memory_mb = 16_384.0;
    r.arch = "x86_64".into();
    if specint.is_finite() {
        r.benchmarks.insert("specint".into(), specint);
    }
    r.updated_ns = NOW - 100_000_000;
    r
}

fn job(cpus: u32) -> Job {
    Job {
        name: "job1".into(),
        cpus,
        reference_time_s: 3600.0,
        reference: [("specint".to_string(), 1000.0)].into_iter().collect(),
        stage_in_s: Some(60.0),
        stage_out_s: Some(30.0),
        ..Job::default()
    }
}

fn all() -> Limits {
    Limits {
        limit: 0,
        rejected: true,
    }
}

fn names(r: &Ranking) -> Vec<&str> {
    r.ranked.iter().map(|x| x.resource.as_str()).collect()
}

fn run(view: Vec<Resource>, job: &Job, policy: Policy) -> Ranking {
    rank(
        &Snapshot::new(NOW, view),
        job,
        policy,
        &RankConfig::default(),
        all(),
    )
    .unwrap()
}

#[test]
fn the_ttd_worked_example_ranks_c_first() {
    // notes §4.A point 4: A is fast but busy, B slow and idle, C in between and idle.
    let view = vec![
        host("A", 8.0, 0.0, 10.0, 2000.0),
        host("B", 8.0, 8.0, 0.0, 1000.0),
        host("C", 8.0, 4.0, 0.0, 1500.0),
    ];
    let r = run(view, &job(4), Policy::Ttd);
    assert_eq!(names(&r), ["C", "B", "A"]);
    let by = |n: &str| r.ranked.iter().find(|x| x.resource == n).unwrap();
    assert!((by("C").completion_s - 2490.0).abs() < 1e-9);
    assert!((by("B").completion_s - 3690.0).abs() < 1e-9);
    let a = by("A");
    assert!((a.exec_s - 1800.0).abs() < 1e-9);
    assert!(a.wait_s > 600.0, "a busy host waits: {}", a.wait_s);
    assert!((a.completion_s - (1890.0 + a.wait_s)).abs() < 1e-9);
    assert_eq!(by("C").predicted_start(), 60.0);
}

impl Ranked {
    fn predicted_start(&self) -> f64 {
        self.start_s
    }
}

#[test]
fn tts_and_ttd_disagree_on_a_slow_idle_and_a_fast_busy_host() {
    // A starts now but is 3x slower; B starts in 10 min but is 3x faster.
    let mut a = host("A", 8.0, 8.0, 0.0, 1000.0);
    a.benchmarks.insert("specint".into(), 1000.0 / 3.0);
    let mut b = host("B", 8.0, 0.0, 0.0, 3000.0);
    b.reservation_start_s = Some(600.0);
    let mut j = job(1);
    j.stage_in_s = None;
    j.stage_out_s = None;
    assert_eq!(
        names(&run(vec![a.clone(), b.clone()], &j, Policy::Tts)),
        ["A", "B"]
    );
    assert_eq!(names(&run(vec![a, b], &j, Policy::Ttd)), ["B", "A"]);
}

#[test]
fn identical_resources_give_tts_and_ttd_the_same_order() {
    let view: Vec<Resource> = (0..6)
        .map(|i| {
            host(
                &format!("h{i}"),
                8.0,
                (i % 3) as f64 * 4.0,
                (i % 2) as f64,
                1000.0,
            )
        })
        .collect();
    let mut j = job(4);
    j.stage_out_s = None;
    assert_eq!(
        names(&run(view.clone(), &j, Policy::Tts)),
        names(&run(view, &j, Policy::Ttd))
    );
}

#[test]
fn a_reservation_overrides_the_published_load() {
    let mut r = host("R", 8.0, 0.0, 50.0, 1000.0);
    r.reservation_start_s = Some(900.0);
    let out = run(vec![r], &job(4), Policy::Tts);
    assert_eq!(out.ranked[0].start_s, 900.0);
    assert_eq!(out.ranked[0].wait_s, 840.0);
}

#[test]
fn stage_in_from_bytes_uses_the_resource_bandwidth() {
    let mut j = job(1);
    j.stage_in_s = None;
    j.input_bytes = Some(1e9);
    let mut r = host("R", 8.0, 8.0, 0.0, 1000.0);
    r.bandwidth_mbps = 100.0;
    let out = run(vec![r.clone()], &j, Policy::Ttd);
    assert!((out.ranked[0].stage_in_s - 80.0).abs() < 1e-9);
    // Unknown bandwidth: the slowest bandwidth in the view, never faster.
    let mut slow = host("S", 8.0, 8.0, 0.0, 1000.0);
    slow.bandwidth_mbps = 10.0;
    let unknown = host("U", 8.0, 8.0, 0.0, 1000.0);
    let out = run(vec![r, slow, unknown], &j, Policy::Ttd);
    let u = out.ranked.iter().find(|x| x.resource == "U").unwrap();
    assert!((u.stage_in_s - 800.0).abs() < 1e-9);
    assert_eq!(names(&out)[0], "R");
}

#[test]
fn requirements_filter_whatever_the_load() {
    let mut small = host("small", 2.0, 2.0, 0.0, 9000.0);
    small.memory_mb = 1e6;
    let mut arm = host("arm", 64.0, 64.0, 0.0, 9000.0);
    arm.arch = "aarch64".into();
    let mut nomem = host("nomem", 64.0, 64.0, 0.0, 9000.0);
    nomem.memory_mb = 512.0;
    let mut nosw = host("nosw", 64.0, 64.0, 0.0, 9000.0);
    nosw.software = vec!["blas".into()];
    let mut ok = host("ok", 8.0, 0.0, 30.0, 100.0);
    ok.software = vec!["mpi".into(), "blas".into()];
    let mut j = job(4);
    j.memory_mb = 1024.0;
    j.arch = "x86_64".into();
    j.software = vec!["mpi".into()];
    let out = run(vec![small, arm, nomem, nosw, ok], &j, Policy::Ttd);
    assert_eq!(names(&out), ["ok"]);
    let why: BTreeMap<_, _> = out
        .rejected
        .iter()
        .map(|r| (r.resource.as_str(), r.reason.as_str()))
        .collect();
    assert_eq!(why["small"], "has 2 CPUs, the job needs 4");
    assert_eq!(why["arm"], "architecture aarch64 is not x86_64");
    assert_eq!(why["nomem"], "has 512 MiB, the job needs 1024");
    assert_eq!(why["nosw"], "does not provide mpi");
}

#[test]
fn stale_resources_are_excluded_or_estimated_conservatively() {
    let fresh = host("fresh", 8.0, 0.0, 2.0, 1000.0);
    let mut stale = host("stale", 8.0, 8.0, 0.0, 1000.0);
    stale.updated_ns = NOW - 6_000_000_000;
    let view = vec![fresh.clone(), stale.clone()];
    let out = run(view.clone(), &job(4), Policy::Ttd);
    assert_eq!(names(&out), ["fresh"]);
    assert_eq!(out.stale, 1);
    assert!(
        out.rejected[0]
            .reason
            .starts_with("stale: its data is 6000 ms old"),
        "{:?}",
        out.rejected
    );
    let cfg = RankConfig {
        stale: StaleMode::Conservative,
        ..RankConfig::default()
    };
    let out = rank(&Snapshot::new(NOW, view), &job(4), Policy::Ttd, &cfg, all()).unwrap();
    let s = out.ranked.iter().find(|x| x.resource == "stale").unwrap();
    assert!(s.stale);
    // Its published "8 free, nothing queued" would mean no wait: it is not used.
    assert!(s.wait_s > 0.0);
}

#[test]
fn a_missing_benchmark_is_never_predicted_faster() {
    let known = host("known", 8.0, 8.0, 0.0, 500.0);
    let fast = host("fast", 8.0, 8.0, 0.0, 4000.0);
    let unknown = host("unknown", 8.0, 8.0, 0.0, f64::NAN);
    let out = run(vec![known, fast, unknown], &job(1), Policy::Ttd);
    let by = |n: &str| out.ranked.iter().find(|x| x.resource == n).unwrap().exec_s;
    assert_eq!(by("unknown"), by("known"), "the slowest published score");
    assert_eq!(names(&out), ["fast", "known", "unknown"], "ties fall to the name");
    // Nobody publishes it: the reference speed.
    let out = run(vec![host("x", 8.0, 8.0, 0.0, f64::NAN)], &job(1), Policy::Ttd);
    assert_eq!(out.ranked[0].exec_s, 3600.0);
}

#[test]
fn utility_ranks_by_the_class_combination_and_rejects_zero() {
    let mut j = job(1);
    j.user_class = UserClass::Local;
    j.utility = vec![
        Requirement {
            attribute: "free_cpus".into(),
            intervals: vec![
                Interval {
                    min: Some(4.0),
                    max: None,
                    utility: 1.0,
                },
                Interval {
                    min: Some(2.0),
                    max: Some(4.0),
                    utility: 0.5,
                },
            ],
            weight: 1.0,
        },
        Requirement {
            attribute: "bench_specint".into(),
            intervals: vec![
                Interval {
                    min: Some(1500.0),
                    max: None,
                    utility: 1.0,
                },
                Interval {
                    min: None,
                    max: Some(1500.0),
                    utility: 0.4,
                },
            ],
            weight: 1.0,
        },
    ];
    let view = vec![
        host("busy", 8.0, 1.0, 0.0, 3000.0), // free 1 -> 0 -> utility 0
        host("half", 8.0, 3.0, 0.0, 3000.0), // 0.5, 1.0 -> min 0.5
        host("slow", 8.0, 8.0, 0.0, 1000.0), // 1.0, 0.4 -> 0.4
        host("best", 8.0, 8.0, 0.0, 2000.0), // 1.0, 1.0 -> 1
    ];
    let out = run(view.clone(), &j, Policy::Utility);
    assert_eq!(names(&out), ["best", "half", "slow"]);
    assert_eq!(out.ranked[1].utility, 0.5);
    assert!(out
        .rejected
        .iter()
        .any(|r| r.resource == "busy" && r.reason == "utility 0 for class local"));
    j.user_class = UserClass::Admin;
    assert_eq!(names(&run(view.clone(), &j, Policy::Utility)), ["best"]);
    j.user_class = UserClass::Guest;
    j.utility_operator = Operator::Or;
    // or: max; best, half (1.0 via specint), slow (1.0 via free) tie at 1 -> TTD decides.
    let out = run(view, &j, Policy::Utility);
    assert_eq!(out.ranked.len(), 4);
    assert!(out.ranked.iter().all(|r| r.utility == 1.0));
}

#[test]
fn cost_picks_the_cheapest_meeting_the_deadline_and_trades_off() {
    let mk = |n: &str, spec: f64, price: f64| {
        let mut r = host(n, 8.0, 8.0, 0.0, spec);
        r.cost_per_cpu_hour = price;
        r
    };
    let view = vec![
        mk("cheap_slow", 500.0, 0.10), // exec 7200 s -> cost 0.2
        mk("mid", 1000.0, 0.30),       // 3600 s -> 0.3
        mk("fast_dear", 4000.0, 2.00), // 900 s -> 0.5
        {
            let mut r = host("noprice", 8.0, 8.0, 0.0, 9000.0);
            r.cost_per_cpu_hour = f64::NAN;
            r
        },
    ];
    let mut j = job(1);
    j.stage_in_s = None;
    j.stage_out_s = None;
    let out = run(view.clone(), &j, Policy::Cost);
    assert_eq!(names(&out), ["cheap_slow", "mid", "fast_dear"]);
    assert!((out.ranked[0].cost - 0.2).abs() < 1e-9);
    assert!(out
        .rejected
        .iter()
        .any(|r| r.resource == "noprice" && r.reason == "publishes no price"));
    j.deadline_s = Some(4000.0);
    let out = run(view.clone(), &j, Policy::Cost);
    assert_eq!(names(&out), ["mid", "fast_dear"]);
    assert!(out
        .rejected
        .iter()
        .any(|r| r.resource == "cheap_slow" && r.reason.starts_with("misses the deadline")));
    j.tradeoff = Some(0.0);
    assert_eq!(names(&run(view.clone(), &j, Policy::Cost)), ["fast_dear", "mid"]);
    j.tradeoff = Some(1.0);
    j.budget = Some(0.25);
    j.deadline_s = None;
    assert_eq!(names(&run(view, &j, Policy::Cost)), ["cheap_slow"]);
}

#[test]
fn an_invalid_job_is_an_error_not_a_ranking() {
    let mut j = job(0);
    j.cpus = 0;
    let e = rank(
        &Snapshot::new(NOW, vec![]),
        &j,
        Policy::Ttd,
        &RankConfig::default(),
        all(),
    )
    .unwrap_err();
    assert_eq!(e.to_string(), "cpus: must be at least 1");
}

/// A random view of hosts `r000`..: CPUs, free CPUs, queue, specint (unknown 1 in 5), memory,
/// arch (aarch64 1 in 5), age up to 8 s, cost.
fn random_view(n: impl Into<prop::collection::SizeRange>) -> impl Strategy<Value = Vec<Resource>> {
    prop::collection::vec(
        (
            prop::sample::select(vec![1u32, 2, 4, 8, 16]).prop_flat_map(|cpus| (Just(cpus), 0..=cpus)),
            0..4u32,
            prop::option::weighted(0.8, 200.0..4000.0f64),
            prop::sample::select(vec![512.0, 2048.0, 8192.0]),
            prop::bool::weighted(0.2),
            0..8_000i64,
            0.01..1.0f64,
        ),
        n,
    )
    .prop_map(|hosts| {
        hosts
            .into_iter()
            .enumerate()
            .map(
                |(i, ((cpus, free), queue, specint, memory_mb, aarch64, age_ms, cost))| {
                    let mut r = host(
                        &format!("r{i:03}"),
                        f64::from(cpus),
                        f64::from(free),
                        f64::from(queue),
                        specint.unwrap_or(f64::NAN),
                    );
                    r.memory_mb = memory_mb;
                    if aarch64 {
                        r.arch = "aarch64".into();
                    }
                    r.updated_ns = NOW - age_ms * 1_000_000;
                    r.cost_per_cpu_hour = cost;
                    r
                },
            )
            .collect()
    })
}

fn random_job() -> impl Strategy<Value = Job> {
    (
        prop::sample::select(vec![1u32, 2, 4, 8]),
        prop::sample::select(vec![0.0, 1024.0, 4096.0]),
        prop::bool::weighted(0.3),
    )
        .prop_map(|(cpus, memory_mb, x86)| {
            let mut j = job(cpus);
            j.memory_mb = memory_mb;
            if x86 {
                j.arch = "x86_64".into();
            }
            j
        })
}

/// A view of 0 to 39 hosts and the same view in another order.
fn view_and_shuffled() -> impl Strategy<Value = (Vec<Resource>, Vec<Resource>)> {
    random_view(0..40).prop_flat_map(|v| (Just(v.clone()), Just(v).prop_shuffle()))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]
    #[test]
    fn property_capacity_is_respected_and_the_order_is_deterministic(
        (view, shuffled) in view_and_shuffled(),
        j in random_job(),
        policy in prop::sample::select(vec![Policy::Ttd, Policy::Tts, Policy::Cost]),
        stale in prop::sample::select(vec![StaleMode::Exclude, StaleMode::Conservative]),
        k in 1..5usize,
    ) {
        let cfg = RankConfig {
            stale,
            ..RankConfig::default()
        };
        let a = rank(&Snapshot::new(NOW, view.clone()), &j, policy, &cfg, all()).unwrap();
        for r in &a.ranked {
            let res = view.iter().find(|v| v.name == r.resource).unwrap();
            prop_assert!(res.total_cpus >= f64::from(j.cpus));
            prop_assert!(j.memory_mb == 0.0 || res.memory_mb >= j.memory_mb);
            prop_assert!(j.arch.is_empty() || res.arch == j.arch);
            prop_assert!(r.start_s >= 0.0 && r.completion_s >= r.start_s);
        }
        prop_assert_eq!(a.ranked.len() + a.rejected.len(), view.len());
        // Same view in another order: the same ranking.
        let b = rank(&Snapshot::new(NOW, shuffled), &j, policy, &cfg, all()).unwrap();
        // (Debug text: utility is NaN outside the utility policy, and NaN != NaN.)
        prop_assert_eq!(format!("{:?}", a.ranked), format!("{:?}", b.ranked));
        // Limits return the same prefix.
        let c = rank(
            &Snapshot::new(NOW, view),
            &j,
            policy,
            &cfg,
            Limits {
                limit: k,
                rejected: false,
            },
        )
        .unwrap();
        prop_assert_eq!(
            format!("{:?}", c.ranked),
            format!("{:?}", &a.ranked[..k.min(a.ranked.len())])
        );
    }
}

/// (job CPUs, total CPUs, free CPUs, queue): 1 <= cpus < 16, cpus <= total < 64, free <= total.
fn load() -> impl Strategy<Value = (u32, f64, f64, f64)> {
    (1..16u32)
        .prop_flat_map(|cpus| (Just(cpus), cpus..64u32))
        .prop_flat_map(|(cpus, total)| {
            let total = f64::from(total);
            (Just(cpus), Just(total), 0.0..=total, 0.0..20.0f64)
        })
}

#[test]
fn property_wait_is_monotone_in_load() {
    proptest!(
        ProptestConfig::with_cases(5000),
        |((cpus, total, free, queue) in load(), more in 0.0..5.0f64, keep in 0.0..1.0f64)| {
            let w = load_wait_s(cpus, total, free, queue, 600.0);
            let more_queue = load_wait_s(cpus, total, free, queue + more, 600.0);
            let less_free = load_wait_s(cpus, total, free * keep, queue, 600.0);
            prop_assert!(
                more_queue >= w && less_free >= w,
                "wait {} more queue {} less free {}",
                w,
                more_queue,
                less_free
            );
            if free >= f64::from(cpus) {
                prop_assert_eq!(load_wait_s(cpus, total, free, 0.0, 600.0), 0.0);
            }
        }
    );
    // Through rank: raising the queue or lowering free CPUs never ranks a host better.
    proptest!(ProptestConfig::with_cases(300), |(view in random_view(12))| {
        let j = job(1);
        let before = run(view.clone(), &j, Policy::Ttd);
        let Some(target) = before.ranked.last().map(|r| r.resource.clone()) else {
            return Ok(());
        };
        let mut worse = view.clone();
        for r in &mut worse {
            if r.name != target {
                r.queue_waiting += 3.0;
                r.free_cpus = 0.0;
            }
        }
        let after = run(worse, &j, Policy::Ttd);
        let pos = |r: &Ranking| r.ranked.iter().position(|x| x.resource == target);
        // The others got busier: the target cannot fall further.
        prop_assert!(pos(&after) <= pos(&before), "{:?} then {:?}", pos(&before), pos(&after));
    });
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]
    #[test]
    fn property_stale_data_is_never_used_as_fresh(mut r in random_view(1).prop_map(|mut v| v.remove(0))) {
        let cfg = RankConfig {
            stale: StaleMode::Conservative,
            ..RankConfig::default()
        };
        r.arch = "x86_64".into();
        r.memory_mb = 8192.0;
        let mut fresh = r.clone();
        fresh.updated_ns = NOW;
        let mut stale = r.clone();
        stale.name = "z-stale".into();
        stale.updated_ns = NOW - 60_000_000_000;
        let j = job(1);
        let out = rank(
            &Snapshot::new(NOW, vec![fresh, stale.clone()]),
            &j,
            Policy::Ttd,
            &cfg,
            all(),
        )
        .unwrap();
        let f = out.ranked.iter().find(|x| !x.stale).unwrap();
        let s = out.ranked.iter().find(|x| x.stale).unwrap();
        // Identical published values: the stale one is never predicted better.
        prop_assert!(s.completion_s >= f.completion_s);
        prop_assert!(s.wait_s > 0.0, "a stale host is never assumed idle");
        let excl = rank(
            &Snapshot::new(NOW, vec![stale]),
            &j,
            Policy::Ttd,
            &RankConfig::default(),
            all(),
        )
        .unwrap();
        prop_assert!(excl.ranked.is_empty());
    }
}
