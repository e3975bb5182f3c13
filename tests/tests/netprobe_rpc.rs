//! The Probe and Clique services of one netprobe, in process (its directory is unreachable: it
//! serves anyway, alone in its clique): answers to good and bad input.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use gma_netprobe::NetprobeConfig;
use gma_proto::v1::{self as pb, clique_client::CliqueClient, probe_client::ProbeClient};
use prost::bytes::Bytes;
use tonic::Code;

async fn start() -> (String, tokio::sync::oneshot::Sender<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = format!("http://{}", listener.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let cfg = NetprobeConfig {
        registration: gma_core::registration::Registration {
            directory: Some("127.0.0.1:1".into()),
            site: "s1".into(),
            ..Default::default()
        },
        source: Some("me".into()),
        max_bytes_per_s: 100_000,
        transfer_bytes: 50_000,
        ..NetprobeConfig::default()
    };
    tokio::spawn(gma_netprobe::run(cfg, listener, async {
        let _ = stopped.await;
    }));
    (addr, stop)
}

async fn channel(addr: &str) -> tonic::transport::Channel {
    let endpoint = tonic::transport::Endpoint::from_shared(addr.to_string()).unwrap();
    gma_tests::wait_for(
        &format!("netprobe at {addr} serving"),
        Duration::from_secs(10),
        || endpoint.connect(),
    )
    .await
}

fn token(generation: u64, seq: u64, holder: &str) -> Option<pb::CliqueToken> {
    Some(pb::CliqueToken {
        generation,
        origin: "a".into(),
        seq,
        holder: holder.into(),
    })
}

fn chunk(data: usize, from: &str, total: u64) -> pb::BulkChunk {
    pb::BulkChunk {
        data: Bytes::from(vec![0u8; data]),
        from: from.into(),
        total,
    }
}

#[tokio::test]
async fn probe_answers_and_refuses_precisely() {
    let (addr, _stop) = start().await;
    let mut p = ProbeClient::new(channel(&addr).await);
    let echo = |payload: usize, from: &str, reserve: u64| pb::EchoRequest {
        payload: Bytes::from(vec![7u8; payload]),
        from: from.into(),
        reserve_bytes: reserve,
        overdue: false,
    };
    let r = p.echo(echo(64, "peer", 50_000)).await.unwrap().into_inner();
    assert_eq!(
        (r.payload.len(), r.host.as_str(), r.granted_bytes),
        (64, "me", 50_000)
    );
    // Within the reservation: measured; the reservation is used up.
    let chunks = vec![chunk(30_000, "peer", 50_000), chunk(20_000, "", 0)];
    let r = p.bulk(tokio_stream::iter(chunks)).await.unwrap().into_inner();
    assert_eq!(r.bytes, 50_000);
    let again = p
        .bulk(tokio_stream::iter(vec![chunk(10, "peer", 10)]))
        .await
        .unwrap_err();
    assert_eq!(again.code(), Code::FailedPrecondition, "{again:?}");
    assert!(
        again.message().contains("call Echo with reserve_bytes first"),
        "{}",
        again.message()
    );
    // More than the budget's bucket (100 kB/s, 100 kB) can ever hold: never granted.
    let r = p.echo(echo(8, "x", 200_000)).await.unwrap().into_inner();
    assert_eq!(r.granted_bytes, 0);
    // Longer than announced, oversized, anonymous.
    p.echo(echo(8, "z", 10)).await.unwrap();
    let long = vec![chunk(8, "z", 10), chunk(8, "", 0)];
    let e = p.bulk(tokio_stream::iter(long)).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    let e = p.echo(echo(70_000, "peer", 0)).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().starts_with("payload:"), "{}", e.message());
    let e = p.echo(echo(8, "", 0)).await.unwrap_err();
    assert!(e.message().starts_with("from:"), "{}", e.message());
    let e = p.echo(echo(8, "peer", 1 << 40)).await.unwrap_err();
    assert!(e.message().starts_with("reserve_bytes:"), "{}", e.message());
    let e = p
        .bulk(tokio_stream::iter(Vec::<pb::BulkChunk>::new()))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
}

#[tokio::test]
async fn the_token_is_taken_once_and_stale_or_foreign_tokens_are_refused() {
    let (addr, _stop) = start().await;
    let mut c = CliqueClient::new(channel(&addr).await);
    let st = c.status(pb::CliqueStatusRequest {}).await.unwrap().into_inner();
    let me = st.id.clone();
    assert_eq!(
        (st.phase.as_str(), st.host.as_str(), st.site.as_str()),
        ("idle", "me", "s1")
    );
    assert_eq!(st.members, std::slice::from_ref(&me));
    let pass = |t: Option<pb::CliqueToken>, site: &str| pb::PassRequest {
        site: site.into(),
        token: t,
        from: "a".into(),
    };
    let r = c.pass(pass(token(5, 1, &me), "s1")).await.unwrap().into_inner();
    assert!(r.accepted);
    let r = c.pass(pass(token(5, 1, &me), "s1")).await.unwrap().into_inner();
    assert!(r.accepted, "the same pass again (a retry) is accepted");
    let r = c.pass(pass(token(4, 9, &me), "s1")).await.unwrap().into_inner();
    assert!(!r.accepted, "an older generation is a stale duplicate");
    assert_eq!(r.newest.unwrap().generation, 5);
    let st = c.status(pb::CliqueStatusRequest {}).await.unwrap().into_inner();
    assert_ne!(st.phase, "idle", "alone, it holds the token");
    assert_eq!(st.tokens_dropped, 1);
    // A newer notice takes it away.
    let r = c
        .notice(pb::NoticeRequest {
            site: "s1".into(),
            token: token(6, 0, "other"),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.newest.unwrap().holder, "other");
    assert_eq!(
        c.status(pb::CliqueStatusRequest {})
            .await
            .unwrap()
            .into_inner()
            .phase,
        "idle"
    );
    // Bad input.
    let e = c.pass(pass(token(7, 0, &me), "s2")).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition);
    assert!(
        e.message().contains("clique \"s1\", not \"s2\""),
        "{}",
        e.message()
    );
    let e = c.pass(pass(None, "s1")).await.unwrap_err();
    assert_eq!((e.code(), e.message()), (Code::InvalidArgument, "token: missing"));
    let e = c.pass(pass(token(0, 0, &me), "s1")).await.unwrap_err();
    assert!(e.message().starts_with("token.generation"), "{}", e.message());
    let e = c.pass(pass(token(7, 0, ""), "s1")).await.unwrap_err();
    assert!(e.message().starts_with("token.holder"), "{}", e.message());
    let r = c
        .pass(pass(token(7, 0, "someone-else"), "s1"))
        .await
        .unwrap()
        .into_inner();
    assert!(
        !r.accepted,
        "a token handed to another member is not ours to take"
    );
}
