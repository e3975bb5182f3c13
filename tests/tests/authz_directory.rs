//! A secured 3-member directory with real processes and generated certificates: raft between
//! members is mutually authenticated (a certificate of the right CA but not a member's is
//! refused, as are peers without a certificate or with another CA's), and the policy answers
//! PERMISSION_DENIED to an authenticated but unauthorized identity for search, watch and
//! register, while an authorized one is served by every member.

#![allow(clippy::unwrap_used)]

use gma_tests as common;

use std::path::Path;
use std::time::Duration;

use common::*;
use gma_proto::raft::raft_client::RaftClient;
use gma_proto::v1 as pb;
use gma_proto::v1::directory_client::DirectoryClient;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

/// A TLS channel trusting `ca`, presenting `who`'s certificate when given.
async fn channel(dir: &Path, addr: &str, ca: &str, who: Option<&str>) -> Result<Channel, String> {
    let pem = |p: String| std::fs::read(dir.join(p)).unwrap();
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(pem(format!("{ca}/ca.pem"))))
        .domain_name("127.0.0.1");
    if let Some(w) = who {
        tls = tls.identity(Identity::from_pem(
            pem(format!("certs/{w}.pem")),
            pem(format!("certs/{w}.key")),
        ));
    }
    Endpoint::from_shared(format!("https://{addr}"))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect_timeout(Duration::from_secs(3))
        // Every call is bounded: a stuck server fails the test with a message, never hangs it.
        .timeout(Duration::from_secs(10))
        .connect()
        .await
        .map_err(|e| format!("{e:?}"))
}

fn record(id: &str) -> pb::Record {
    pb::Record {
        record: Some(pb::record::Record::Producer(pb::ProducerRecord {
            id: id.into(),
            address: "http://127.0.0.1:7001".into(),
            events: vec!["job.state".into()],
            ..Default::default()
        })),
    }
}

fn schema() -> pb::EventSchema {
    pb::EventSchema {
        name: "job.state".into(),
        version: 1,
        fields: vec![gma_core::event::dbl("state", "", "")],
        description: String::new(),
    }
}

async fn register(ch: Channel, id: &str) -> Result<u64, tonic::Status> {
    let mut c = DirectoryClient::new(ch);
    let mut req = tonic::Request::new(pb::RegisterRequest {
        record: Some(record(id)),
        schemas: vec![schema()],
        lease_ttl_ms: 60_000,
    });
    req.set_timeout(Duration::from_secs(8));
    c.register(req).await.map(|r| r.into_inner().lease_id)
}

async fn search(ch: Channel, pattern: &str, stale_ok: bool) -> Result<Vec<String>, tonic::Status> {
    let r = DirectoryClient::new(ch)
        .search(pb::SearchRequest {
            event_pattern: pattern.into(),
            stale_ok,
            ..Default::default()
        })
        .await?;
    Ok(r.into_inner()
        .entries
        .into_iter()
        .filter_map(|e| match e.record?.record? {
            pb::record::Record::Producer(p) => Some(p.id),
            pb::record::Record::Consumer(c) => Some(c.id),
        })
        .collect())
}

#[test]
fn a_secured_cluster_authenticates_members_and_enforces_the_policy() {
    let tmp = tempdir();
    let dir = tmp.path();
    let d = dir.to_str().unwrap().to_string();
    make_certs(
        dir,
        &["ca", "other-ca"],
        &[
            ("ca", "dir-1", "grid"),
            ("ca", "dir-2", "grid"),
            ("ca", "dir-3", "grid"),
            ("ca", "alice", "site1"),
            ("ca", "carol", "site1"),
            ("other-ca", "mallory", "site1"),
        ],
    );
    let policy = dir.join("policy.toml");
    std::fs::write(
        &policy,
        r#"default = "deny"
[[rule]]
cn = "alice"
actions = ["*"]
effect = "allow"
[[rule]]
cn = "carol"
actions = ["directory.search"]
resources = ["host.*"]
effect = "allow"
"#,
    )
    .unwrap();

    let addrs: Vec<String> = (0..3).map(|_| reserved_addr()).collect();
    let peers = addrs
        .iter()
        .enumerate()
        .map(|(i, a)| format!("{}={a}", i + 1))
        .collect::<Vec<_>>()
        .join(",");
    let mut nodes = Vec::new();
    for (i, addr) in addrs.iter().enumerate() {
        let n = i + 1;
        let cfg = dir.join(format!("n{n}.toml"));
        std::fs::write(
            &cfg,
            format!(
                "data_dir = \"{d}/n{n}\"\nlisten = \"{addr}\"\nnode_id = {n}\npeers = \"{peers}\"\ninit = {}\n\
                 access_policy = \"{d}/policy.toml\"\n[[members]]\ncn = \"dir-*\"\norg = \"grid\"\n\
                 [tls]\ncert = \"{d}/certs/dir-{n}.pem\"\nkey = \"{d}/certs/dir-{n}.key\"\nclient_ca = \"{d}/ca/ca.pem\"\n",
                n == 1
            ),
        )
        .unwrap();
        nodes.push(Proc::start(
            &["directory", "--config", cfg.to_str().unwrap()],
            "gma directory listening on",
        ));
    }

    let rt = tokio::runtime::Runtime::new().unwrap();
    // Alice registers through every member in turn (writes on followers are forwarded to the
    // leader over mutually authenticated raft), and every member has all three records.
    for (i, a) in addrs.iter().enumerate() {
        let id = format!("p{i}");
        assert!(
            wait_until(Duration::from_secs(30), || {
                rt.block_on(async {
                    match channel(dir, a, "ca", Some("alice")).await {
                        Ok(ch) => register(ch, &id).await.is_ok(),
                        Err(_) => false,
                    }
                })
            }),
            "alice could not register through member {}: {}",
            i + 1,
            nodes[i].stderr_text()
        );
    }
    let sees = |a: &str, n: usize| {
        wait_until(Duration::from_secs(15), || {
            rt.block_on(async {
                match channel(dir, a, "ca", Some("alice")).await {
                    Ok(ch) => search(ch, "job.*", true).await.is_ok_and(|ids| ids.len() == n),
                    Err(_) => false,
                }
            })
        })
    };
    for a in &addrs {
        assert!(sees(a, 3), "member {a} does not list the 3 records");
    }

    let lease = rt.block_on(async {
        // Carol is authenticated but not authorized: search of job.*, watch and register are
        // refused with PERMISSION_DENIED naming her and the rule; host.* she may search.
        let ch = channel(dir, &addrs[0], "ca", Some("carol")).await.unwrap();
        let e = search(ch.clone(), "job.*", false).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
        assert!(
            e.message().contains("CN=carol, O=site1 may not directory.search"),
            "{}",
            e.message()
        );
        assert!(e.message().contains("policy.toml"), "{}", e.message());
        assert!(search(ch.clone(), "host.*", false).await.is_ok());
        let e = register(ch.clone(), "carols").await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
        let e = DirectoryClient::new(ch.clone())
            .watch(pb::WatchRequest {
                event_pattern: "job.*".into(),
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");

        // Nor may she renew alice's lease.
        let lease = register(
            channel(dir, &addrs[0], "ca", Some("alice")).await.unwrap(),
            "alices",
        )
        .await
        .unwrap();
        lease
    });
    // The member carol asks must have applied alice's record (it authorizes against its own
    // state; the leader re-checks against its own, see the state tests).
    assert!(sees(&addrs[0], 4), "member 1 does not list alices");
    rt.block_on(async {
        let ch = channel(dir, &addrs[0], "ca", Some("carol")).await.unwrap();
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        tx.send(pb::KeepAliveRequest { lease_id: lease }).await.unwrap();
        let mut replies = DirectoryClient::new(ch.clone())
            .keep_alive(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await
            .unwrap()
            .into_inner();
        let e = tokio::time::timeout(Duration::from_secs(10), replies.message())
            .await
            .expect("a KeepAlive answer within 10 s")
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
        assert!(
            e.message().contains("may not directory.register \"alices\""),
            "{}",
            e.message()
        );

        // Raft: a certificate of the cluster's CA that is not a member's is refused...
        let ch = channel(dir, &addrs[1], "ca", Some("alice")).await.unwrap();
        let e = RaftClient::new(ch)
            .vote(gma_proto::raft::RaftRequest { data: b"{}".to_vec() })
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
        assert!(e.message().contains("not a directory member"), "{}", e.message());
        // ... and peers without a certificate, with another CA's, or in plaintext never get a
        // request through.
        for (ca, who) in [("ca", None), ("ca", Some("mallory"))] {
            let served = match channel(dir, &addrs[1], ca, who).await {
                Err(_) => false,
                Ok(ch) => RaftClient::new(ch)
                    .vote(gma_proto::raft::RaftRequest { data: b"{}".to_vec() })
                    .await
                    .is_ok(),
            };
            assert!(!served, "raft served {who:?}");
            let served = match channel(dir, &addrs[1], ca, who).await {
                Err(_) => false,
                Ok(ch) => search(ch, "*", true).await.is_ok(),
            };
            assert!(!served, "directory served {who:?}");
        }
        let plain = Endpoint::from_shared(format!("http://{}", addrs[1]))
            .unwrap()
            .connect()
            .await;
        if let Ok(ch) = plain {
            assert!(search(ch, "*", true).await.is_err(), "served plaintext");
        }
    });

    // The cluster is still whole: alice's write commits and reaches every member.
    rt.block_on(async {
        let ch = channel(dir, &addrs[2], "ca", Some("alice")).await.unwrap();
        register(ch, "after").await.unwrap();
    });
    for a in &addrs {
        assert!(sees(a, 5), "member {a} does not list the 5 records");
    }
    drop(nodes);
}

#[test]
fn a_tls_cluster_without_a_client_ca_is_refused() {
    let tmp = tempdir();
    let d = tmp.path().to_str().unwrap().to_string();
    make_certs(tmp.path(), &["ca"], &[("ca", "dir-1", "grid")]);
    let r = gma(
        &[
            "directory",
            "--data",
            &format!("{d}/n1"),
            "--listen",
            "127.0.0.1:0",
            "--peers",
            "1=127.0.0.1:1,2=127.0.0.1:2",
            "--tls-cert",
            &format!("{d}/certs/dir-1.pem"),
            "--tls-key",
            &format!("{d}/certs/dir-1.key"),
        ],
        Duration::from_secs(20),
    );
    assert_ne!(r.code, 0);
    assert!(r.stderr.contains("set tls.client_ca"), "{}", r.stderr);
}

/// Starts a 3-member mTLS directory whose configs carry `members` (TOML lines) and the policy
/// `policy.toml` in `dir`; returns the processes and their addresses.
fn secured_cluster(dir: &Path, members: &str) -> (Vec<Proc>, Vec<String>) {
    let d = dir.to_str().unwrap();
    let addrs: Vec<String> = (0..3).map(|_| reserved_addr()).collect();
    let peers = addrs
        .iter()
        .enumerate()
        .map(|(i, a)| format!("{}={a}", i + 1))
        .collect::<Vec<_>>()
        .join(",");
    let mut nodes = Vec::new();
    for (i, addr) in addrs.iter().enumerate() {
        let n = i + 1;
        let cfg = dir.join(format!("n{n}.toml"));
        std::fs::write(
            &cfg,
            format!(
                "data_dir = \"{d}/n{n}\"\nlisten = \"{addr}\"\nnode_id = {n}\npeers = \"{peers}\"\ninit = {}\n\
                 access_policy = \"{d}/policy.toml\"\n{members}\n\
                 [tls]\ncert = \"{d}/certs/dir-{n}.pem\"\nkey = \"{d}/certs/dir-{n}.key\"\nclient_ca = \"{d}/ca/ca.pem\"\n",
                n == 1
            ),
        )
        .unwrap();
        nodes.push(Proc::start(
            &["directory", "--config", cfg.to_str().unwrap()],
            "gma directory listening on",
        ));
    }
    (nodes, addrs)
}

/// The address of the member that leads, as `who` sees it from `addrs[0]`.
async fn leader_addr(dir: &Path, addrs: &[String], who: &str) -> Option<String> {
    let ch = channel(dir, &addrs[0], "ca", Some(who)).await.ok()?;
    let st = DirectoryClient::new(ch)
        .cluster_status(pb::ClusterStatusRequest {})
        .await
        .ok()?
        .into_inner();
    let leader = st.members.iter().find(|m| m.leader)?;
    Some(leader.address.trim_start_matches("http://").to_string())
}

/// A raft `Forward` of `command` (the JSON of a directory command) sent with `who`'s
/// certificate to `addr`.
async fn forward(
    dir: &Path,
    addr: &str,
    who: &str,
    command: &str,
    caller: Option<(&str, &str)>,
) -> Result<String, tonic::Status> {
    let ch = channel(dir, addr, "ca", Some(who))
        .await
        .map_err(tonic::Status::unavailable)?;
    let r = RaftClient::new(ch)
        .forward(gma_proto::raft::ForwardRequest {
            command: command.as_bytes().to_vec(),
            caller: caller.map(|(cn, org)| gma_proto::raft::Caller {
                cn: cn.into(),
                org: org.into(),
            }),
        })
        .await?;
    Ok(String::from_utf8_lossy(&r.into_inner().reply).to_string())
}

/// Issue 26, defect 3: a certificate of the cluster's CA whose CN looks like a member's but
/// whose organization is not the members' may not send raft traffic: its forwarded `Remove` of
/// a record is refused and the record stays. A member's certificate gets no more from the
/// client API than the policy gives it.
#[test]
fn a_certificate_named_like_a_member_is_not_a_member() {
    let tmp = tempdir();
    let dir = tmp.path();
    make_certs(
        dir,
        &["ca"],
        &[
            ("ca", "dir-1", "grid"),
            ("ca", "dir-2", "grid"),
            ("ca", "dir-3", "grid"),
            ("ca", "dir-evil", "partner"),
            ("ca", "alice", "site1"),
        ],
    );
    std::fs::write(
        dir.join("policy.toml"),
        "default = \"deny\"\n[[rule]]\ncn = \"alice\"\nactions = [\"*\"]\neffect = \"allow\"\n",
    )
    .unwrap();
    let members: String = (1..=3)
        .map(|n| format!("[[members]]\nid = {n}\ncn = \"dir-{n}\"\norg = \"grid\"\n"))
        .collect();
    let (nodes, addrs) = secured_cluster(dir, &members);
    let rt = tokio::runtime::Runtime::new().unwrap();
    assert!(
        wait_until(Duration::from_secs(30), || {
            rt.block_on(async {
                match channel(dir, &addrs[1], "ca", Some("alice")).await {
                    Ok(ch) => register(ch, "victim").await.is_ok(),
                    Err(_) => false,
                }
            })
        }),
        "alice could not register: {}",
        nodes[1].stderr_text()
    );
    let mut leader = None;
    assert!(
        wait_until(Duration::from_secs(15), || {
            leader = rt.block_on(leader_addr(dir, &addrs, "alice"));
            leader.is_some()
        }),
        "no member names a leader"
    );
    let leader = leader.unwrap();
    let remove = r#"{"Remove":{"kind":"Producer","id":"victim"}}"#;
    let r = rt.block_on(forward(
        dir,
        &leader,
        "dir-evil",
        remove,
        Some(("alice", "site1")),
    ));
    let e = r.expect_err("a forwarded Remove from CN=dir-evil, O=partner was served");
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
    assert!(e.message().contains("not a directory member"), "{}", e.message());
    // A real member forwarding for a client the leader's policy refuses: refused by the leader.
    let other = addrs.iter().find(|a| **a != leader).unwrap().clone();
    let r = rt.block_on(forward(dir, &leader, "dir-2", remove, Some(("carol", "site1"))));
    let reply = r.expect("the leader answers a member's forward");
    assert!(reply.contains("PermissionDenied"), "{reply}");
    assert!(
        reply.contains("CN=carol, O=site1 may not directory.register"),
        "{reply}"
    );
    // ... and a forward that does not say for whom.
    let e = rt
        .block_on(forward(dir, &leader, "dir-2", remove, None))
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    // A member certificate speaks only as its own node id.
    let vote = r#"{"vote":{"leader_id":{"term":999,"node_id":3},"committed":false},"last_log_id":null}"#;
    let e = rt
        .block_on(async {
            let ch = channel(dir, &other, "ca", Some("dir-2")).await.unwrap();
            RaftClient::new(ch)
                .vote(gma_proto::raft::RaftRequest {
                    data: vote.as_bytes().to_vec(),
                })
                .await
        })
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
    assert!(e.message().contains("not node 3"), "{}", e.message());
    // The record is still there, on every member (a linearizable read: a member that has not
    // learned who leads yet answers UNAVAILABLE, and is asked again).
    for a in &addrs {
        let mut ids = None;
        assert!(
            wait_until(Duration::from_secs(15), || {
                ids = rt.block_on(async {
                    let ch = channel(dir, a, "ca", Some("alice")).await.ok()?;
                    search(ch, "job.*", false).await.ok()
                });
                ids.is_some()
            }),
            "member {a} does not answer a linearizable search"
        );
        assert_eq!(ids.unwrap(), vec!["victim".to_string()], "member {a}");
    }
    // Nor does CN=dir-evil get anything as a client: the policy does not name it; nor may it
    // speak for alice on a read.
    let e = rt
        .block_on(async {
            let ch = channel(dir, &addrs[0], "ca", Some("dir-evil")).await.unwrap();
            search(ch, "*", true).await
        })
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
    let e = rt
        .block_on(async {
            let ch = channel(dir, &addrs[0], "ca", Some("dir-evil")).await.unwrap();
            let mut req = tonic::Request::new(pb::SearchRequest::default());
            req.metadata_mut().insert_bin(
                "gma-caller-cn-bin",
                tonic::metadata::MetadataValue::from_bytes(b"alice"),
            );
            req.metadata_mut().insert_bin(
                "gma-caller-org-bin",
                tonic::metadata::MetadataValue::from_bytes(b"site1"),
            );
            DirectoryClient::new(ch).search(req).await
        })
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
    assert!(e.message().contains("may not speak for"), "{}", e.message());
    // A member's certificate is not a client super-user: the policy does not name O=grid.
    for call in ["search", "remove"] {
        let e = rt
            .block_on(async {
                let ch = channel(dir, &other, "ca", Some("dir-2")).await.unwrap();
                let mut c = DirectoryClient::new(ch.clone());
                match call {
                    "search" => search(ch, "*", true).await.map(|_| ()),
                    _ => c
                        .remove(pb::RemoveRequest {
                            kind: pb::RecordKind::Producer as i32,
                            id: "victim".into(),
                        })
                        .await
                        .map(|_| ()),
                }
            })
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::PermissionDenied, "{call}: {e:?}");
    }
    // alice renews a lease through a follower: the KeepAlive is forwarded in her name and the
    // leader's policy lets her.
    let ttl = rt.block_on(async {
        let lease = register(
            channel(dir, &other, "ca", Some("alice")).await.unwrap(),
            "renewed",
        )
        .await
        .unwrap();
        let ch = channel(dir, &other, "ca", Some("alice")).await.unwrap();
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        tx.send(pb::KeepAliveRequest { lease_id: lease }).await.unwrap();
        let mut replies = DirectoryClient::new(ch)
            .keep_alive(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await
            .unwrap()
            .into_inner();
        tokio::time::timeout(Duration::from_secs(10), replies.message())
            .await
            .expect("a KeepAlive answer within 10 s")
            .unwrap()
            .unwrap()
            .ttl_ms
    });
    assert_eq!(ttl, 60_000);
    // A member forwarding for alice, whom the policy allows: the carried identity counts.
    let reply = rt
        .block_on(forward(dir, &leader, "dir-2", remove, Some(("alice", "site1"))))
        .unwrap();
    assert!(reply.contains("\"Ok\""), "{reply}");
    assert!(
        wait_until(Duration::from_secs(15), || addrs.iter().all(|a| rt.block_on(
            async {
                match channel(dir, a, "ca", Some("alice")).await {
                    Ok(ch) => search(ch, "job.*", true)
                        .await
                        .is_ok_and(|ids| ids == vec!["renewed".to_string()]),
                    Err(_) => false,
                }
            }
        ))),
        "alice's forwarded Remove did not reach every member"
    );
    drop(nodes);
}

/// The old member rule (`member_cn`, a CN glob) and a TLS cluster without `[[members]]` are
/// refused at start with what to write instead.
#[test]
fn a_tls_cluster_must_name_its_members() {
    let tmp = tempdir();
    let d = tmp.path().to_str().unwrap().to_string();
    make_certs(tmp.path(), &["ca"], &[("ca", "dir-1", "grid")]);
    for (extra, expect) in [
        (
            "member_cn = \"dir-*\"\n",
            "member_cn = \"dir-*\" is no longer accepted",
        ),
        ("", "add [[members]] entries"),
        (
            "[[members]]\nid = 1\ncn = \"dir-1\"\norg = \"grid\"\n",
            "node 2 has no [[members]] entry",
        ),
        (
            "[[members]]\ncn = \"dir-*\"\norg = \"site1\"\n",
            "this member's certificate is CN=dir-1, O=grid, which no [[members]] entry admits as node 1",
        ),
    ] {
        let cfg = tmp.path().join("n.toml");
        std::fs::write(
            &cfg,
            format!(
                "data_dir = \"{d}/n1\"\nlisten = \"127.0.0.1:0\"\npeers = \"1=127.0.0.1:1,2=127.0.0.1:2\"\n{extra}\
                 [tls]\ncert = \"{d}/certs/dir-1.pem\"\nkey = \"{d}/certs/dir-1.key\"\nclient_ca = \"{d}/ca/ca.pem\"\n"
            ),
        )
        .unwrap();
        let r = gma(
            &["directory", "--config", cfg.to_str().unwrap()],
            Duration::from_secs(20),
        );
        assert_eq!(r.code, 1, "{extra}: {}", r.stderr);
        assert!(r.stderr.contains(expect), "{extra}: {}", r.stderr);
    }
}
