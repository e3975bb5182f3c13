//! The federation endpoint's RPCs in one process (no directory): every bad input gets a precise
//! status, and a crafted forward whose visited list holds the receiver is FAILED_PRECONDITION.

#![allow(clippy::unwrap_used)]

use gma_broker::job::Job;
use gma_federation::config::FederationConfig;
use gma_federation::service::with_site;
use gma_federation::site::{Link, Role};
use gma_proto::v1 as pb;
use tonic::Code;

async fn endpoint() -> (String, tokio::sync::oneshot::Sender<()>) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let cfg = FederationConfig {
        registration: gma_core::registration::Registration {
            site: "B".into(),
            ..Default::default()
        },
        peer: vec![Link {
            site: "A".into(),
            endpoint: "127.0.0.1:1".into(),
            role: Role::Peer,
            hops: 0,
        }],
        ..FederationConfig::default()
    };
    let (tx, rx) = tokio::sync::oneshot::channel();
    tokio::spawn(gma_federation::service::run(cfg, l, async move {
        let _ = rx.await;
    }));
    (addr, tx)
}

fn job() -> pb::JobSpec {
    Job {
        name: "j".into(),
        cpus: 1,
        reference_time_s: 60.0,
        ..Job::default()
    }
    .to_proto()
}

#[tokio::test]
async fn bad_federation_calls_get_precise_statuses() {
    let (addr, _stop) = endpoint().await;
    let ch = gma_tests::connected(addr).await;
    let mut fed = pb::federation_client::FederationClient::new(ch.clone());
    let fwd = |visited: &[&str]| pb::ForwardRequest {
        global_job_id: "A/1".into(),
        job: Some(job()),
        origin_site: "A".into(),
        visited_sites: visited.iter().map(|s| s.to_string()).collect(),
        hops_left: 0,
        origin_lease_ms: 30_000,
        idempotency_key: "A/1".into(),
        submitted_ns: 1,
    };
    // The receiver in the visited list: a loop.
    let e = fed
        .forward_job(with_site("A", fwd(&["A", "B"])))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains("already been at B"), "{}", e.message());
    // No site named; a site that is not linked; a site id that is not one.
    let e = fed.forward_job(fwd(&["A"])).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    let e = fed.forward_job(with_site("Z", fwd(&["Z"]))).await.unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    assert!(e.message().contains("not a linked site of B"), "{}", e.message());
    let e = fed.forward_job(with_site("a/b", fwd(&["A"]))).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    // No hosts at B: nothing can hold the job.
    let e = fed.forward_job(with_site("A", fwd(&["A"]))).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains("no host of B"), "{}", e.message());
    // A bad job spec, a bad id.
    let mut bad = fwd(&["A"]);
    bad.job.as_mut().unwrap().cpus = 0;
    let e = fed.forward_job(with_site("A", bad)).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("job.cpus"), "{}", e.message());
    let mut bad = fwd(&["A"]);
    bad.global_job_id = "no-slash".into();
    let e = fed.forward_job(with_site("A", bad)).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    // A start grant for a job B never forwarded: no.
    let r = fed
        .confirm_start(with_site(
            "A",
            pb::ConfirmStartRequest {
                global_job_id: "B/x".into(),
                host: "h".into(),
            },
        ))
        .await
        .unwrap()
        .into_inner();
    assert!(!r.granted);
    // A session must be opened by the site it claims, then attached.
    let e = fed
        .open_session(with_site(
            "A",
            pb::Hello {
                site_id: "C".into(),
                ..Default::default()
            },
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    let frames = tokio_stream::iter(vec![pb::Frame {
        kind: Some(pb::frame::Kind::Heartbeat(pb::Heartbeat { now_ns: 1 })),
    }]);
    let e = fed.exchange(with_site("A", frames)).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    let frames = tokio_stream::iter(vec![pb::Frame {
        kind: Some(pb::frame::Kind::Attach(pb::Attach {
            session_id: "nope".into(),
        })),
    }]);
    let e = fed.exchange(with_site("A", frames)).await.unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{e:?}");
    // Cancelling what is not there.
    let e = fed
        .cancel_job(with_site(
            "A",
            pb::CancelJobRequest {
                global_job_id: "A/404".into(),
                reason: String::new(),
            },
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");

    // The local scheduler API.
    let mut sched = pb::site_scheduler_client::SiteSchedulerClient::new(ch);
    let e = sched
        .submit(pb::SubmitJobRequest {
            job: None,
            site: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    let e = sched
        .submit(pb::SubmitJobRequest {
            job: Some(job()),
            site: "Z".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().contains("not a linked site"), "{}", e.message());
    let e = sched
        .status(pb::JobStatusRequest {
            global_job_id: "B/none".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
    let id = sched
        .submit(pb::SubmitJobRequest {
            job: Some(job()),
            site: String::new(),
        })
        .await
        .unwrap()
        .into_inner()
        .global_job_id;
    assert!(id.starts_with("B/"), "{id}");
    let r = sched
        .cancel(pb::CancelJobRequest {
            global_job_id: id.clone(),
            reason: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.state, "cancelled");
    let st = sched
        .federation_status(pb::FederationStatusRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(st.site, "B");
    assert_eq!(st.peers[0].site, "A");
    assert!(!st.peers[0].eligible);
}

#[tokio::test]
async fn bad_grid_calls_get_precise_statuses() {
    let (addr, _stop) = endpoint().await;
    let ch = gma_tests::connected(addr).await;
    let mut fed = pb::federation_client::FederationClient::new(ch.clone());
    let mut grid = pb::grid_client::GridClient::new(ch);
    let q = |id: &str, path: &[&str]| pb::GridQuery {
        query_id: id.into(),
        requirements: Some(job()),
        levels: None,
        path: path.iter().map(|s| s.to_string()).collect(),
        deadline_ms: 0,
        max_results: 0,
    };
    // Between sites: only linked ones, the path ending with the caller, never back to the
    // receiver.
    let e = fed.query(with_site("Z", q("q1", &["Z"]))).await.unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    let e = fed.query(with_site("A", q("q1", &["C"]))).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(
        e.message().contains("must end with the calling site"),
        "{}",
        e.message()
    );
    let e = fed.query(with_site("A", q("q1", &["B", "A"]))).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    let e = fed.query(with_site("A", q("", &["A"]))).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    // From a linked site, well formed: B has no hosts (no directory), so nothing matches, and
    // a peer link is not a parent: no escalation.
    let a = fed
        .query(with_site("A", q("q1", &["A"])))
        .await
        .unwrap()
        .into_inner();
    assert!(a.resources.is_empty() && a.escalations.is_empty(), "{a:?}");
    assert_eq!(a.answered, ["B"]);
    // The same id again is an echo: answered empty, counted.
    let a = fed
        .query(with_site("A", q("q1", &["A"])))
        .await
        .unwrap()
        .into_inner();
    assert_eq!((a.duplicates, a.answered.len()), (1, 0), "{a:?}");
    // Applications: requirements validated by field, bounds enforced, no path.
    let mut bad = q("", &[]);
    bad.requirements = None;
    let e = grid.query(bad).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    let mut bad = q("", &[]);
    bad.requirements.as_mut().unwrap().memory_mb = -1.0;
    let e = grid.query(bad).await.unwrap_err();
    assert!(e.message().contains("requirements.memory_mb"), "{}", e.message());
    let mut bad = q("", &[]);
    bad.deadline_ms = 600_000;
    assert_eq!(grid.query(bad).await.unwrap_err().code(), Code::InvalidArgument);
    let mut bad = q("", &[]);
    bad.max_results = 1_000_000;
    assert_eq!(grid.query(bad).await.unwrap_err().code(), Code::InvalidArgument);
    assert_eq!(
        grid.query(q("", &["A"])).await.unwrap_err().code(),
        Code::InvalidArgument
    );
    let a = grid.query(q("", &[])).await.unwrap().into_inner();
    assert!(a.query_id.starts_with("B-"), "{a:?}");
    // Reservations: the host and the job are required, and the host must be one of B's.
    let res = |host: &str, job: Option<pb::JobSpec>| pb::GridReserveRequest {
        host: host.into(),
        job,
        exclusive: true,
        start_s: 0,
        duration_s: 60,
    };
    let e = grid.reserve(res("", Some(job()))).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    let e = grid.reserve(res("h", None)).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    let e = grid.reserve(res("h", Some(job()))).await.unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{e:?}");
    let mut past = res("h", Some(job()));
    past.start_s = 1_000;
    assert_eq!(
        grid.reserve(past).await.unwrap_err().code(),
        Code::InvalidArgument
    );
    for n in [0, 7] {
        let r = pb::GridReservationRef { number: n };
        assert_eq!(grid.start(r).await.unwrap_err().code(), Code::NotFound);
        assert_eq!(grid.release(r).await.unwrap_err().code(), Code::NotFound);
    }
    let l = grid.list(pb::GridListRequest {}).await.unwrap().into_inner();
    assert!(l.reservations.is_empty());
}
