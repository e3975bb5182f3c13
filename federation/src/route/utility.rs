//! The `utility` route policy: Vasques' Algorithm 1 (notes/utility-and-provisioning.md §1.3),
//! pure like the rest of `route()`.
//!
//! ```text
//! bestLocal = max over the fresh local hosts r of CalculateUtility(r, job)
//! for each candidate peer p (in a per-job order):
//!     if CalculateUtility(p's resume, job) > bestLocal: forward to p; stop
//! assign to the best local host
//! ```
//!
//! - **CalculateUtility** is the broker's utility ranking (`Policy::Utility` of
//!   `gma_broker::rank`: the job's partial-utility step functions combined by its user class),
//!   the same function on a host and on a resume.
//! - **The resume** of a peer is, per resource class that can hold the job's arch, one
//!   composite resource read from the summary ([`resume_resources`]): the CPUs, free CPUs and
//!   load of the class's least-loaded node, the memory of its most-memory node, the class's
//!   lowest benchmark scores (the paper's resume carries no speed; the lowest keeps the
//!   estimate from promising a speed no node has). As the paper notes, the two nodes may
//!   differ, so the composite is optimistic (it may over-forward). A summary from an older
//!   sender, without the two nodes, falls back to `cpus_free_max_node` (as both CPUs and free
//!   CPUs), the class's mean load and `memory_mb_max_node`. The peer's utility is the best
//!   over its classes. The average utilization (`1 − cpus_free_sum / cpus_total`) is carried
//!   but no requirement attribute reads it.
//! - **Candidates** pass the same checks as under `ttd` ([`peer_eligible`]: live, fresh, not
//!   visited nor refusing, a hop left, accepts foreign jobs within its quota, in-flight cap),
//!   the paper's unbounded forwarding made finite (notes §1.3 [gap]: hop budget + visited set).
//! - **First better, not best**: the paper forwards to the first peer in iteration order
//!   whose utility exceeds the local best, strictly (ties stay). The order is unspecified;
//!   here it is the hash of (job id, site), so different jobs try peers in different orders
//!   and the result is deterministic.
//! - **Assign**: to the best-utility local host (ties by predicted completion, then name)
//!   with the job's CPUs free now; when every host of the best utility is busy the job
//!   waits for one (`Queue`), as the paper's `AssignJob` queues at that resource. Utility 0
//!   everywhere queues too (no host rejects nothing; a better moment may come).
//! - A job without utility requirements has utility 1 everywhere, so it never leaves.

use gma_broker::{rank_candidates, Job, Policy, RankConfig, Resource, Snapshot};

use crate::route::{
    host_now, peer_eligible, tie, Decision, LocalView, PeerView, Route, RouteJob, RoutePolicy,
};
use crate::summary::{HostDigest, Summary};

/// The composite resources of a resume (one per class), fresh at `now_ns`.
pub fn resume_resources(site: &str, s: &Summary, now_ns: i64) -> Vec<Resource> {
    s.classes
        .iter()
        .filter(|(_, c)| c.nodes_up > 0)
        .map(|(k, c)| {
            let ll = c.least_loaded.unwrap_or(HostDigest {
                cpus_total: c.cpus_free_max_node,
                cpus_free: c.cpus_free_max_node,
                load_milli: if c.nodes_up > 0 {
                    c.load_milli_sum / u64::from(c.nodes_up)
                } else {
                    0
                },
                memory_mb: c.mem_max_node,
            });
            let memory = c.most_memory.map_or(c.mem_max_node, |d| d.memory_mb);
            let mut r = Resource::unknown(&format!("{site}:{}/{}", k.arch, k.os));
            r.site = site.to_string();
            r.total_cpus = f64::from(ll.cpus_total);
            r.free_cpus = f64::from(ll.cpus_free);
            r.load1 = ll.load_milli as f64 / 1000.0;
            r.queue_waiting = 0.0;
            r.memory_mb = memory as f64;
            r.arch = k.arch.clone();
            r.os = k.os.clone();
            r.benchmarks = c.benchmarks.iter().map(|(b, x)| (b.clone(), x.min)).collect();
            r.updated_ns = now_ns;
            r
        })
        .collect()
}

/// The job's utility on `resources` (the best; 0 when none gives it any).
fn best_utility(resources: &Snapshot, job: &Job, rank: &RankConfig) -> f64 {
    rank_candidates(resources, job, Policy::Utility, rank)
        .ok()
        .and_then(|r| r.first().map(|x| x.utility))
        .unwrap_or(0.0)
}

/// The job's utility on a peer's resume.
pub fn peer_utility(p: &PeerView<'_>, job: &Job, rank: &RankConfig, now_ns: i64) -> f64 {
    let snap = Snapshot::new(now_ns, resume_resources(p.site, p.summary, now_ns));
    best_utility(&snap, job, rank)
}

/// Algorithm 1 (see the module doc). Pure and deterministic.
pub fn route_utility(
    local: &LocalView<'_>,
    peers: &[PeerView<'_>],
    job: &RouteJob<'_>,
    policy: &RoutePolicy,
    now_ns: i64,
) -> Decision {
    let j = job.job;
    let ranking = rank_candidates(local.snapshot, j, Policy::Utility, local.rank).unwrap_or_default();
    let best_local = ranking.first().map_or(0.0, |r| r.utility);
    let mut order: Vec<&PeerView<'_>> = peers.iter().collect();
    order.sort_by(|a, b| {
        tie(job.id, a.site)
            .cmp(&tie(job.id, b.site))
            .then(a.site.cmp(b.site))
    });
    let mut candidates = 0;
    let mut seen: Option<(String, f64)> = None;
    for p in order {
        if peer_eligible(p, job, policy, now_ns).is_err() {
            continue;
        }
        candidates += 1;
        let u = peer_utility(p, j, local.rank, local.snapshot.now_ns);
        if u > best_local {
            return Decision {
                route: Route::Forward {
                    site: p.site.to_string(),
                },
                local_s: None,
                best_peer: None,
                candidates,
                utility: Some((best_local, Some((p.site.to_string(), u)))),
            };
        }
        if seen.as_ref().is_none_or(|s| u > s.1) {
            seen = Some((p.site.to_string(), u));
        }
    }
    // The best-utility hosts, in the ranking's order (predicted completion, then name).
    let best: Vec<_> = ranking
        .iter()
        .take_while(|r| r.utility >= best_local)
        .cloned()
        .collect();
    let now = host_now(local, &best, j.cpus);
    let (route, local_s) = match now {
        _ if best.is_empty() => (
            Route::Queue {
                reason: "utility 0 on every local host and no peer offers more".into(),
            },
            None,
        ),
        Some(i) => (
            Route::Local {
                host: best[i].resource.clone(),
            },
            Some(best[i].completion_s),
        ),
        None => (
            Route::Queue {
                reason: format!("waiting for a local host of utility {best_local:.3} (none is free)"),
            },
            None,
        ),
    };
    Decision {
        route,
        local_s,
        best_peer: None,
        candidates,
        utility: Some((best_local, seen)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::route::{debit, Forwarding};
    use gma_broker::utility::{Interval, Operator, Requirement, UserClass};

    use crate::route::tests::{host, summary_of, view, NOW};

    fn req(attribute: &str, steps: &[(f64, f64)]) -> Requirement {
        Requirement {
            attribute: attribute.into(),
            intervals: steps
                .iter()
                .map(|&(min, utility)| Interval {
                    min: Some(min),
                    max: None,
                    utility,
                })
                .collect(),
            weight: 0.0,
        }
    }

    /// 2 CPUs; memory: ≥ 32 GiB → 1, ≥ 8 GiB → 0.5; free CPUs: ≥ 8 → 1, ≥ 2 → 0.6; `local`
    /// class (minimum).
    fn job() -> Job {
        Job {
            name: "j".into(),
            cpus: 2,
            reference_time_s: 600.0,
            user_class: UserClass::Local,
            utility_operator: Operator::And,
            utility: vec![
                req("memory_mb", &[(32768.0, 1.0), (8192.0, 0.5)]),
                req("free_cpus", &[(8.0, 1.0), (2.0, 0.6)]),
            ],
            ..Job::default()
        }
    }

    fn policy() -> RoutePolicy {
        RoutePolicy {
            policy: Forwarding::Utility,
            ..RoutePolicy::default()
        }
    }

    fn decide(
        local_hosts: Vec<Resource>,
        peers: &[PeerView<'_>],
        j: &Job,
        id: &str,
        visited: &[String],
    ) -> Decision {
        let snap = Snapshot::new(NOW, local_hosts);
        let cfg = RankConfig::default();
        let local = LocalView {
            snapshot: &snap,
            rank: &cfg,
            releases: &[],
            ahead: &[],
        };
        let rj = RouteJob {
            id,
            job: j,
            visited,
            hops_left: 1,
            excluded: &[],
        };
        crate::route::route(&local, peers, &rj, &policy(), NOW)
    }

    fn o() -> Vec<String> {
        vec!["o".to_string()]
    }

    #[test]
    fn a_peer_whose_resume_offers_more_gets_the_job_even_when_it_could_start_here() {
        // Local: 8 GiB hosts with CPUs free (utility min(0.5, 1) = 0.5); peer b: 64 GiB, idle (1).
        let local = vec![host("l1", 16.0, 16.0, 8192.0)];
        let b = summary_of("b", vec![host("b1", 16.0, 16.0, 65536.0)]);
        let d = decide(local, &[view("b", &b)], &job(), "o/1", &o());
        assert_eq!(d.route, Route::Forward { site: "b".into() });
        assert_eq!(d.utility, Some((0.5, Some(("b".to_string(), 1.0)))));
        // The TTD policy keeps it: a host has the CPUs free now.
        let snap = Snapshot::new(NOW, vec![host("l1", 16.0, 16.0, 8192.0)]);
        let cfg = RankConfig::default();
        let lv = LocalView {
            snapshot: &snap,
            rank: &cfg,
            releases: &[],
            ahead: &[],
        };
        let (j, v) = (job(), o());
        let rj = RouteJob {
            id: "o/1",
            job: &j,
            visited: &v,
            hops_left: 1,
            excluded: &[],
        };
        let ttd = crate::route::route(&lv, &[view("b", &b)], &rj, &RoutePolicy::default(), NOW);
        assert_eq!(ttd.route, Route::Local { host: "l1".into() });
    }

    #[test]
    fn equal_utility_stays_and_goes_to_the_best_utility_host_not_the_fastest() {
        // Local: l-fast (16 CPUs, 8 GiB: 0.5) and l-big (4 CPUs free of 4, 64 GiB: min(1, 0.6)
        // = 0.6). Peer: same as l-big (0.6): a tie stays local, on l-big.
        let local = vec![
            host("l-fast", 16.0, 16.0, 8192.0),
            host("l-big", 4.0, 4.0, 65536.0),
        ];
        let b = summary_of("b", vec![host("b1", 4.0, 4.0, 65536.0)]);
        let d = decide(local.clone(), &[view("b", &b)], &job(), "o/1", &o());
        assert_eq!(d.route, Route::Local { host: "l-big".into() });
        assert_eq!(d.utility, Some((0.6, Some(("b".to_string(), 0.6)))));
        // The best-utility host busy: the job waits for it rather than run on l-fast.
        let mut busy = local;
        busy[1].free_cpus = 0.0;
        busy[1].load1 = 4.0;
        let d = decide(busy, &[], &job(), "o/1", &o());
        // l-big busy drops to free_cpus 0 → utility 0; l-fast (0.5) is then the best: runs.
        assert_eq!(
            d.route,
            Route::Local {
                host: "l-fast".into()
            }
        );
        // A requirement on memory only: l-big stays the best while busy, so the job queues.
        let mut j = job();
        j.utility.truncate(1);
        let mut busy = vec![
            host("l-fast", 16.0, 16.0, 8192.0),
            host("l-big", 4.0, 1.0, 65536.0),
        ];
        busy[1].load1 = 3.0;
        let d = decide(busy, &[], &j, "o/1", &o());
        assert!(
            matches!(&d.route, Route::Queue { reason } if reason.contains("utility 1.000")),
            "{d:?}"
        );
    }

    #[test]
    fn the_first_better_peer_in_the_job_order_wins_not_the_best() {
        let local = vec![host("l1", 16.0, 16.0, 4096.0)]; // memory < 8 GiB: utility 0
        let b = summary_of("b", vec![host("b1", 16.0, 16.0, 65536.0)]); // 1.0
        let c = summary_of("c", vec![host("c1", 16.0, 4.0, 65536.0)]); // min(1, 0.6) = 0.6
        let peers = [view("b", &b), view("c", &c)];
        // Over many job ids both orders occur; each time the first in the hash order is chosen.
        let mut to_c = 0;
        for k in 0..40 {
            let id = format!("o/{k}");
            let first = if tie(&id, "b") < tie(&id, "c") { "b" } else { "c" };
            let d = decide(local.clone(), &peers, &job(), &id, &o());
            assert_eq!(d.route, Route::Forward { site: first.into() }, "{id}");
            to_c += usize::from(first == "c");
        }
        assert!(to_c > 0 && to_c < 40, "both orders occur: {to_c} of 40 to c");
    }

    #[test]
    fn the_resume_is_an_optimistic_composite_of_two_nodes() {
        // Peer b: b1 idle with 4 GiB, b2 busy with 64 GiB. No single node gives utility > 0.5
        // (b1: memory 0; b2: free 2 → 0.6, memory 1 → 0.6), but the resume (least-loaded b1's
        // 16 free CPUs with most-memory b2's 64 GiB) promises 1: the paper's over-forwarding.
        let b = summary_of(
            "b",
            vec![host("b1", 16.0, 16.0, 4096.0), host("b2", 16.0, 2.0, 65536.0)],
        );
        let r = resume_resources("b", &b, NOW);
        assert_eq!((r.len(), r[0].free_cpus, r[0].memory_mb), (1, 16.0, 65536.0));
        let local = vec![host("l1", 16.0, 16.0, 8192.0)]; // 0.5
        let d = decide(local.clone(), &[view("b", &b)], &job(), "o/1", &o());
        assert_eq!(d.route, Route::Forward { site: "b".into() });
        // An older sender (no digests): free CPUs from cpus_free_max_node, memory from
        // memory_mb_max_node — the same composite here.
        let mut old = b.clone();
        for c in old.classes.values_mut() {
            c.least_loaded = None;
            c.most_memory = None;
        }
        let r = resume_resources("b", &old, NOW);
        assert_eq!(
            (r[0].total_cpus, r[0].free_cpus, r[0].memory_mb),
            (16.0, 16.0, 65536.0)
        );
        let d = decide(local, &[view("b", &old)], &job(), "o/1", &o());
        assert_eq!(d.route, Route::Forward { site: "b".into() });
    }

    #[test]
    fn visited_stale_and_dead_peers_are_not_candidates_and_the_debit_lowers_the_resume() {
        let local = vec![host("l1", 16.0, 16.0, 8192.0)]; // 0.5
        let b = summary_of("b", vec![host("b1", 8.0, 8.0, 65536.0)]); // 1.0
        let visited = vec!["o".to_string(), "b".to_string()];
        let d = decide(local.clone(), &[view("b", &b)], &job(), "o/1", &visited);
        assert_eq!(d.route, Route::Local { host: "l1".into() });
        assert_eq!(d.candidates, 0);
        let mut dead = view("b", &b);
        dead.live = false;
        let d = decide(local.clone(), &[dead], &job(), "o/1", &o());
        assert_eq!(d.route, Route::Local { host: "l1".into() });
        let mut stale = view("b", &b);
        stale.received_ns = NOW - 20_000_000_000;
        let d = decide(local.clone(), &[stale], &job(), "o/1", &o());
        assert_eq!(d.route, Route::Local { host: "l1".into() });
        // After one 2-CPU forward the origin's copy shows 6 free on b's least-loaded node
        // (utility min(1, 0.6) = 0.6 > 0.5: still better); after three, 2 (0.6); after four,
        // 0 → utility 0: the job stays.
        let mut debited = b.clone();
        for (n, expect_forward) in [(1, true), (2, true), (3, true), (4, false)] {
            debit(&mut debited, 2, "");
            let ll = debited.classes.values().next().unwrap().least_loaded.unwrap();
            assert_eq!(ll.cpus_free, 8 - 2 * n);
            let mut p = view("b", &b);
            p.summary = &debited;
            let d = decide(local.clone(), &[p], &job(), "o/1", &o());
            assert_eq!(
                matches!(d.route, Route::Forward { .. }),
                expect_forward,
                "{n}: {d:?}"
            );
        }
    }

    #[test]
    fn a_job_without_requirements_never_leaves_and_utility_zero_everywhere_queues() {
        let mut j = job();
        j.utility.clear();
        let local = vec![host("l1", 16.0, 16.0, 1024.0)];
        let b = summary_of("b", vec![host("b1", 64.0, 64.0, 65536.0)]);
        let d = decide(local.clone(), &[view("b", &b)], &j, "o/1", &o());
        assert_eq!(d.route, Route::Local { host: "l1".into() });
        let tiny = summary_of("b", vec![host("b1", 64.0, 64.0, 1024.0)]);
        let d = decide(local, &[view("b", &tiny)], &job(), "o/1", &o());
        assert!(
            matches!(&d.route, Route::Queue { reason } if reason.starts_with("utility 0")),
            "{d:?}"
        );
    }

    #[test]
    fn the_policy_is_chosen_in_the_route_table() {
        let p: RoutePolicy = gma_core::config::parse_toml("policy = \"utility\"\n", "t").unwrap();
        assert_eq!(p.policy, Forwarding::Utility);
        let p: RoutePolicy = gma_core::config::parse_toml("", "t").unwrap();
        assert_eq!(p.policy, Forwarding::Ttd);
        let e = gma_core::config::parse_toml::<RoutePolicy>("policy = \"best\"\n", "t").unwrap_err();
        assert!(e.to_string().contains("unknown variant `best`"), "{e}");
        assert_eq!(Forwarding::parse("utility"), Some(Forwarding::Utility));
        assert_eq!(Forwarding::parse("x"), None);
    }
}
