use super::*;
use gma_broker::Resource;

const NOW: i64 = 1_000_000_000_000;

fn site(name: &str, peers: &[(&str, Role)]) -> SiteState {
    let mut s = SiteState::new(Params::new(name), 1);
    s.set_links(
        peers
            .iter()
            .map(|(p, r)| Link {
                site: p.to_string(),
                endpoint: format!("127.0.0.1:1/{p}"),
                role: *r,
                hops: 0,
            })
            .collect(),
        NOW,
    );
    s
}

fn snap(free: f64) -> Snapshot {
    let mut r = Resource::unknown("h0");
    r.total_cpus = 8.0;
    r.free_cpus = free;
    r.memory_mb = 4096.0;
    r.arch = "x86_64".into();
    r.queue_waiting = 0.0;
    r.producer = "p".into();
    r.updated_ns = NOW;
    Snapshot::new(NOW, vec![r])
}

/// A 2-CPU, 60 s job.
fn two_cpu_job() -> Job {
    Job {
        name: "j".into(),
        cpus: 2,
        reference_time_s: 60.0,
        ..Job::default()
    }
}

fn req(id: &str, visited: &[&str]) -> pb::ForwardRequest {
    let job = Job {
        name: "j".into(),
        cpus: 2,
        reference_time_s: 60.0,
        ..Job::default()
    };
    pb::ForwardRequest {
        global_job_id: id.into(),
        job: Some(job.to_proto()),
        origin_site: id.split('/').next().unwrap().into(),
        visited_sites: visited.iter().map(|s| s.to_string()).collect(),
        hops_left: 0,
        origin_lease_ms: 30_000,
        idempotency_key: id.into(),
        submitted_ns: NOW,
    }
}

#[test]
fn forwards_are_checked_deduplicated_and_loops_refused() {
    let mut b = site("b", &[("a", Role::Peer)]);
    let s = snap(8.0);
    let r = b.accept_forward("a", &req("a/1", &["a"]), &s, NOW).unwrap();
    assert_eq!(r.state, "queued");
    // The same forward again (a retry): the same answer, still one job.
    assert_eq!(
        b.accept_forward("a", &req("a/1", &["a"]), &s, NOW)
            .unwrap()
            .global_job_id,
        "a/1"
    );
    assert_eq!(b.jobs().count(), 1);
    assert!(matches!(
        b.accept_forward("a", &req("a/2", &["a", "b"]), &s, NOW),
        Err(Reject::Loop(_))
    ));
    assert!(matches!(
        b.accept_forward("x", &req("x/1", &["x"]), &s, NOW),
        Err(Reject::NotPeer(_))
    ));
    assert!(matches!(
        b.accept_forward("a", &req("a/3", &["c"]), &s, NOW),
        Err(Reject::Invalid(_))
    ));
    let mut big = req("a/4", &["a"]);
    big.job.as_mut().unwrap().cpus = 64;
    assert!(matches!(
        b.accept_forward("a", &big, &s, NOW),
        Err(Reject::Infeasible(_))
    ));
}

#[test]
fn a_start_is_granted_once_and_never_for_a_re_placed_job() {
    let mut a = site("a", &[("b", Role::Peer), ("c", Role::Peer)]);
    let id = a
        .submit(
            Job {
                name: "j".into(),
                cpus: 2,
                reference_time_s: 60.0,
                ..Job::default()
            },
            Some("b".into()),
            NOW,
        )
        .unwrap();
    a.heard("b", NOW);
    a.step(NOW, &snap(0.0));
    assert_eq!(a.job(&id).unwrap().state, JobState::Forwarding);
    assert!(
        matches!(a.confirm_start("c", &id, NOW), Grant::No(_)),
        "c does not hold it"
    );
    assert_eq!(a.confirm_start("b", &id, NOW), Grant::Yes);
    assert_eq!(a.confirm_start("b", &id, NOW), Grant::Yes, "idempotent");
    // A granted job is never re-placed, however long b stays silent.
    a.step(NOW + 3_600_000_000_000, &snap(8.0));
    assert_eq!(a.job(&id).unwrap().at, "b");

    let id2 = a
        .submit(
            Job {
                name: "k".into(),
                cpus: 2,
                reference_time_s: 60.0,
                ..Job::default()
            },
            Some("b".into()),
            NOW,
        )
        .unwrap();
    let t = NOW + 3_600_000_000_001;
    a.heard("b", t);
    a.step(t, &snap(0.0));
    assert_eq!(a.job(&id2).unwrap().state, JobState::Forwarding);
    // b silent for lease + 2 heartbeats: re-placed; b's later request is refused.
    let later = t + 35_000_000_000;
    a.step(later, &snap(0.0));
    assert_eq!(a.job(&id2).unwrap().state, JobState::Queued);
    assert!(matches!(a.confirm_start("b", &id2, later), Grant::No(_)));
}

#[test]
fn summaries_follow_split_horizon() {
    let mut p = site(
        "p",
        &[
            ("c1", Role::Child),
            ("c2", Role::Child),
            ("q", Role::Peer),
            ("gp", Role::Parent),
        ],
    );
    for (k, cpus) in [("c1", 8.0), ("c2", 4.0), ("q", 2.0), ("gp", 1.0)] {
        let mut r = Resource::unknown(&format!("{k}-h"));
        r.total_cpus = cpus;
        r.free_cpus = cpus;
        r.updated_ns = NOW;
        let s =
            Summary::build(k, &Snapshot::new(NOW, vec![r]), 5_000, Default::default(), 15_000).stamp(k, 1, 1);
        p.heard(k, NOW);
        p.peer_summary(k, s, NOW).unwrap();
    }
    p.step(NOW, &snap(1.0));
    let free = |to: &str| p.summary_for(to, NOW).unwrap().cpus_free_sum();
    assert_eq!(free("q"), 1, "a peer gets the site alone");
    assert_eq!(free("gp"), 1 + 8 + 4, "a parent gets the site and its children");
    assert_eq!(
        free("c1"),
        1 + 4 + 1,
        "a child gets the site, its parent and the other children"
    );
    let to_c1 = p.summary_for("c1", NOW).unwrap();
    assert!(!to_c1.contributing.contains("c1"));
    // An echo (a summary containing the receiver) is refused.
    let mut echo = p.summary_for("gp", NOW).unwrap();
    echo.site = "c1".into();
    let mut q = site("c2", &[("c1", Role::Peer)]);
    echo.contributing.insert("c2".into());
    assert!(q
        .peer_summary("c1", echo, NOW)
        .unwrap_err()
        .to_string()
        .contains("split horizon"));
}

#[test]
fn saved_state_restores_jobs() {
    let mut a = site("a", &[("b", Role::Peer)]);
    let id = a
        .submit(
            Job {
                name: "j".into(),
                cpus: 2,
                reference_time_s: 60.0,
                ..Job::default()
            },
            None,
            NOW,
        )
        .unwrap();
    a.step(NOW, &snap(8.0));
    assert_eq!(a.job(&id).unwrap().state, JobState::Running);
    let text = serde_json::to_string(&a.saved()).unwrap();
    let saved: Saved = serde_json::from_str(&text).unwrap();
    let mut r = SiteState::restore(Params::new("a"), 2, saved, NOW + 1);
    assert_eq!(r.job(&id).unwrap().job, a.job(&id).unwrap().job);
    assert_eq!(r.links().len(), 1);
    r.step(NOW + 3_600_000_000_000, &snap(6.0));
    assert_eq!(r.job(&id).unwrap().state, JobState::Finished);
}

#[test]
fn a_job_refused_for_good_by_one_site_is_accepted_by_the_next() {
    let mut a = site("a", &[("b", Role::Peer), ("c", Role::Peer)]);
    let id = a.submit(two_cpu_job(), Some("b".into()), NOW).unwrap();
    a.heard("b", NOW);
    a.step(NOW, &snap(0.0));
    assert_eq!(a.job(&id).unwrap().at, "b");
    // b refuses it for good: b stays in its visited list, so it never goes back there.
    a.refused(&id, "b", "full", None, NOW);
    assert_eq!(a.job(&id).unwrap().visited, ["a", "b"]);
    // Then it is forwarded to c (as step does when it routes there).
    if let Some(j) = a.jobs.get_mut(&id) {
        j.state = JobState::Forwarding;
        j.at = "c".into();
        j.visited.push("c".into());
    }
    let fwd = a.forward_request(&id).unwrap();
    let mut c = site("c", &[("a", Role::Peer), ("b", Role::Peer)]);
    let r = c.accept_forward("a", &fwd, &snap(8.0), NOW);
    assert!(r.is_ok(), "{fwd:?}: {r:?}");
    // b is still never visited again: c refuses to send it there (a loop to b is refused).
    assert!(c.job(&id).unwrap().visited.contains(&"b".to_string()));
}

/// Re-attachment replaces silent parents only: a parent that refuses the session (it has not
/// added this site yet) answered, so it is heard until it stops answering.
#[test]
fn a_parent_refusing_the_session_is_heard_not_silent() {
    let mut s = site("a", &[("p", Role::Parent)]);
    assert_eq!(s.parents(NOW), vec![("p".to_string(), false)]);
    let refusal = "refused: PermissionDenied: a is not a linked site of p".to_string();
    s.session_event("p", SessionEvent::Refused(refusal), NOW);
    assert_eq!(s.parents(NOW + 1), vec![("p".to_string(), true)]);
    // Nothing from it (no refusal either) for longer than the session timeout: silent.
    let later = NOW + s.p.session_timeout_ns() + 1;
    assert_eq!(s.parents(later), vec![("p".to_string(), false)]);
    // Unreachable after refusing (a Down does not renew it).
    s.session_event("p", SessionEvent::Down("cannot connect".into()), later);
    assert_eq!(s.parents(later + 1), vec![("p".to_string(), false)]);
}

#[test]
fn links_removed_at_runtime_stay_removed_across_a_restart_and_parents_are_listed() {
    let mut s = site("a", &[("p", Role::Parent), ("r", Role::Peer)]);
    assert_eq!(s.parents(NOW), vec![("p".to_string(), false)]);
    let r = s.peer("r").unwrap().link.clone();
    let g = Link {
        site: "g".into(),
        endpoint: "g:1".into(),
        role: Role::Parent,
        hops: 0,
    };
    // A re-attachment: p goes, g comes.
    s.set_links(vec![r.clone(), g.clone()], NOW);
    let saved = s.saved();
    assert_eq!(saved.removed, vec!["p".to_string()]);
    let mut back = SiteState::restore(Params::new("a"), 2, saved, NOW + 1);
    assert_eq!(back.removed().cloned().collect::<Vec<_>>(), ["p"]);
    assert_eq!(back.parents(NOW + 1), vec![("g".to_string(), false)]);
    // Linked again: no longer removed.
    let p = Link {
        site: "p".into(),
        endpoint: "p:1".into(),
        role: Role::Parent,
        hops: 0,
    };
    back.set_links(vec![r, g, p], NOW + 2);
    assert!(back.saved().removed.is_empty());
}

#[test]
fn a_removed_link_settles_the_jobs_there_a_started_one_as_failed() {
    let mut a = site("a", &[("b", Role::Peer)]);
    let started = a.submit(two_cpu_job(), Some("b".into()), NOW).unwrap();
    let waiting = a.submit(two_cpu_job(), Some("b".into()), NOW).unwrap();
    a.heard("b", NOW);
    a.step(NOW, &snap(0.0));
    assert_eq!(a.job(&started).unwrap().at, "b");
    assert_eq!(a.confirm_start("b", &started, NOW), Grant::Yes);
    // b's link removed (its manager died and this site re-attached elsewhere).
    a.set_links(vec![], NOW + 1);
    let s = a.job(&started).unwrap();
    assert_eq!(s.state, JobState::Failed, "{s:?}");
    assert!(s.reason.contains("outcome is unknown"), "{}", s.reason);
    let w = a.job(&waiting).unwrap();
    assert_eq!(
        w.state,
        JobState::Queued,
        "never started there: back in the queue"
    );
}

fn sup(s: &str) -> Superior {
    Superior {
        site: s.into(),
        endpoint: format!("{s}:1"),
        directory: format!("{s}:2"),
    }
}

#[test]
fn a_parent_s_superiors_become_the_default_chain_and_survive_a_restart() {
    // m has parent g (whose directory it learned from g's Welcome) and child c.
    let mut m = site("m", &[("g", Role::Parent), ("c", Role::Child)]);
    assert!(
        m.superiors_to_tell(&[]).is_empty(),
        "g's directory is not known yet"
    );
    m.set_directory("g", "g:2");
    let told = m.superiors_to_tell(&[sup("x")]);
    assert_eq!(
        told.iter().map(|s| s.site.as_str()).collect::<Vec<_>>(),
        ["g", "x"]
    );
    assert_eq!(told[0].endpoint, "127.0.0.1:1/g");
    assert_eq!(told[0].directory, "g:2");

    // c, configured with only its parent m, keeps what m told: g first.
    let mut c = site("c", &[("m", Role::Parent), ("p", Role::Peer)]);
    assert!(!c.told_by("p", vec![sup("z")]), "a peer is not a parent");
    assert!(c.told_by("m", vec![sup("g"), sup("c"), sup("m"), sup("g"), sup("x")]));
    assert!(!c.told_by("m", vec![sup("g"), sup("x")]), "unchanged");
    let names = |v: Vec<Superior>| v.into_iter().map(|s| s.site).collect::<Vec<_>>();
    assert_eq!(names(c.chain(&[])), ["g", "x"]);
    // Configured entries come first, each site once.
    assert_eq!(names(c.chain(&[sup("x"), sup("y")])), ["x", "y", "g"]);
    // m dies: the chain is kept, across a restart too.
    let mut back = SiteState::restore(Params::new("c"), 2, c.saved(), NOW);
    assert_eq!(names(back.chain(&[])), ["g", "x"]);
    // Re-attached to g (m's link removed): m's list no longer counts.
    let g = Link {
        site: "g".into(),
        endpoint: "g:1".into(),
        role: Role::Parent,
        hops: 0,
    };
    back.set_links(vec![g], NOW + 1);
    assert!(back.chain(&[]).is_empty());
    // At most MAX_TOLD kept.
    let many: Vec<Superior> = (0..20).map(|i| sup(&format!("s{i}"))).collect();
    assert!(back.told_by("g", many));
    assert_eq!(back.chain(&[]).len(), MAX_TOLD);
}
