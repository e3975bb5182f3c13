//! A hostile-input attack on a running directory and producer: garbage bytes and malformed
//! HTTP/2 on the ports, truncated, oversized and non-UTF-8 protobufs, lying gRPC frames, huge
//! patterns and floods of subscriptions. Every call gets a precise gRPC status (or the
//! connection is closed), no process crashes, and the data held before the attack is intact
//! after it.

#![allow(clippy::unwrap_used)]

use gma_tests as common;

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::pin::Pin;
use std::time::Duration;

use common::*;
use gma_proto::v1 as pb;
use prost::bytes::{Buf, BufMut};
use prost::Message;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::codegen::{http, Body as _, Service as _};
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status};

const MAX: usize = gma_core::MAX_MESSAGE_BYTES;
const MIB: usize = 1024 * 1024;

// ---------------------------------------------------------------------------------------------
// Sending arbitrary bytes as gRPC messages.

/// A codec that sends its bytes as the message as they are and hands back response messages
/// as raw bytes: the request need not be a valid protobuf.
#[derive(Debug, Clone, Copy, Default)]
struct Raw;

impl Codec for Raw {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = Raw;
    type Decoder = Raw;
    fn encoder(&mut self) -> Raw {
        Raw
    }
    fn decoder(&mut self) -> Raw {
        Raw
    }
}

impl Encoder for Raw {
    type Item = Vec<u8>;
    type Error = Status;
    fn encode(&mut self, item: Vec<u8>, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for Raw {
    type Item = Vec<u8>;
    type Error = Status;
    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Vec<u8>>, Status> {
        let mut v = vec![0; src.remaining()];
        src.copy_to_slice(&mut v);
        Ok(Some(v))
    }
}

/// One HTTP/2 connection.
async fn channel(addr: &str) -> Channel {
    Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap()
}

/// Sends `msg` as the only request message of `path` (unary and streaming methods alike: on
/// the wire they are the same) and returns the first response message, or the status.
async fn call_raw(ch: &Channel, path: &str, msg: Vec<u8>) -> Result<Option<Vec<u8>>, Status> {
    let mut g = tonic::client::Grpc::new(ch.clone()).max_decoding_message_size(MAX);
    g.ready().await.map_err(|e| Status::unavailable(e.to_string()))?;
    let path = http::uri::PathAndQuery::try_from(path).unwrap();
    let call = g.streaming(tonic::Request::new(tokio_stream::once(msg)), path, Raw);
    let mut s = tokio::time::timeout(Duration::from_secs(20), call)
        .await
        .map_err(|_| Status::deadline_exceeded("test: no response within 20 s"))??
        .into_inner();
    tokio::time::timeout(Duration::from_secs(20), s.message())
        .await
        .map_err(|_| Status::deadline_exceeded("test: no message within 20 s"))?
}

/// Sends `body` as the raw HTTP/2 request body of `path`: the gRPC framing (flag, length
/// prefix) is the caller's, so it can lie. The bytes must be ASCII (they travel in a String).
async fn call_frames(
    ch: &Channel,
    path: &str,
    body: Vec<u8>,
    headers: &[(&'static str, &'static str)],
) -> Status {
    let mut ch = ch.clone();
    std::future::poll_fn(|cx| ch.poll_ready(cx)).await.unwrap();
    let mut req = http::Request::builder()
        .method(http::Method::POST)
        .uri(path)
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let body = String::from_utf8(body).expect("frame bytes must be ASCII");
    let req = req.body(tonic::body::Body::new(body)).unwrap();
    let resp = tokio::time::timeout(Duration::from_secs(20), ch.call(req))
        .await
        .expect("no response within 20 s")
        .unwrap();
    if let Some(s) = Status::from_header_map(resp.headers()) {
        return s;
    }
    let mut body = resp.into_body();
    loop {
        let frame = tokio::time::timeout(
            Duration::from_secs(20),
            std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)),
        )
        .await
        .expect("no trailers within 20 s");
        match frame {
            Some(Ok(f)) => {
                if let Ok(t) = f.into_trailers() {
                    return Status::from_header_map(&t)
                        .unwrap_or_else(|| Status::unknown("test: trailers without grpc-status"));
                }
            }
            Some(Err(s)) => return s,
            None => return Status::unknown("test: response ended without grpc-status"),
        }
    }
}

/// A gRPC frame: compression flag, a length prefix (which may lie), the bytes.
fn grpc_frame(flag: u8, claimed_len: u32, bytes: &[u8]) -> Vec<u8> {
    let mut f = vec![flag];
    f.extend_from_slice(&claimed_len.to_be_bytes());
    f.extend_from_slice(bytes);
    f
}

/// A length-delimited protobuf field (field number < 16).
fn ld(field: u8, bytes: &[u8]) -> Vec<u8> {
    let mut out = vec![(field << 3) | 2];
    prost::encoding::encode_varint(bytes.len() as u64, &mut out);
    out.extend_from_slice(bytes);
    out
}

/// `bytes` after checking that they really are not a valid `M` (else the case proves nothing).
fn undecodable<M: Message + Default>(bytes: Vec<u8>) -> Vec<u8> {
    assert!(
        M::decode(&bytes[..]).is_err(),
        "test bytes unexpectedly decode as {}",
        std::any::type_name::<M>()
    );
    bytes
}

/// A valid encoding with its last `cut` bytes dropped: truncated mid-field.
fn truncated<M: Message + Default>(m: &M, cut: usize) -> Vec<u8> {
    let mut b = m.encode_to_vec();
    assert!(b.len() > cut);
    b.truncate(b.len() - cut);
    undecodable::<M>(b)
}

/// Deterministic junk.
fn junk(n: usize, seed: u32) -> Vec<u8> {
    let mut x = seed;
    (0..n)
        .map(|_| {
            x = x.wrapping_mul(1_103_515_245).wrapping_add(12345);
            (x >> 16) as u8
        })
        .collect()
}

/// What the attack saw that it should not have, collected so one run reports all of it.
#[derive(Default)]
struct Findings(Vec<String>);

impl Findings {
    /// Expects `r` to fail with `code` and a message containing `text`.
    fn status<T>(&mut self, what: &str, r: Result<T, Status>, code: Code, text: &str) {
        match r {
            Ok(_) => self.0.push(format!("{what}: answered OK, expected {code:?}")),
            Err(s) => self.check(what, &s, code, text),
        }
    }

    fn check(&mut self, what: &str, s: &Status, code: Code, text: &str) {
        let msg = s.message();
        eprintln!(
            "{what}: {:?} {:?}",
            s.code(),
            msg.chars().take(160).collect::<String>()
        );
        if s.code() != code || !msg.contains(text) || msg.is_empty() {
            self.0.push(format!(
                "{what}: got {:?} {:?}, expected {code:?} with {text:?}",
                s.code(),
                msg.chars().take(300).collect::<String>()
            ));
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Raw TCP.

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

fn h2_frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let n = payload.len();
    let mut f = vec![(n >> 16) as u8, (n >> 8) as u8, n as u8, kind, flags];
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// What a server did with a hostile connection.
#[derive(Debug)]
struct Hangup {
    /// The server closed the connection (EOF or reset) within 10 s.
    closed: bool,
    /// The error code of the GOAWAY it sent, if any.
    goaway: Option<u32>,
}

/// Writes `bytes` on a new connection (then half-closes it if asked) and reads until the
/// server hangs up.
fn hostile_connection(addr: &str, bytes: &[u8], half_close: bool) -> Hangup {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    // The server may hang up before reading it all: write errors are part of the game.
    let _ = s.write_all(bytes);
    if half_close {
        let _ = s.shutdown(Shutdown::Write);
    }
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let closed = loop {
        match s.read(&mut buf) {
            Ok(0) => break true,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                break false
            }
            Err(_) => break true,
        }
    };
    Hangup {
        closed,
        goaway: goaway_code(&got),
    }
}

/// The error code of the first GOAWAY frame in what the server sent.
fn goaway_code(mut b: &[u8]) -> Option<u32> {
    while b.len() >= 9 {
        let n = ((b[0] as usize) << 16) | ((b[1] as usize) << 8) | b[2] as usize;
        if b.len() < 9 + n {
            return None;
        }
        if b[3] == 7 && n >= 8 {
            return Some(u32::from_be_bytes(b[13..17].try_into().unwrap()));
        }
        b = &b[9 + n..];
    }
    None
}

const H2_PROTOCOL_ERROR: u32 = 0x1;
const H2_FRAME_SIZE_ERROR: u32 = 0x6;

fn garbage_connections(addr: &str, f: &mut Findings) {
    let settings = h2_frame(4, 0, 0, &[]);
    let with_preface = |frames: &[Vec<u8>]| {
        let mut b = PREFACE.to_vec();
        b.extend_from_slice(&settings);
        for fr in frames {
            b.extend_from_slice(fr);
        }
        b
    };
    let cases: Vec<(&str, Vec<u8>, bool, Option<u32>)> = vec![
        ("random bytes", junk(64 * 1024, 7), false, None),
        (
            "an HTTP/1.1 gRPC request",
            b"POST /gma.v1.Directory/Search HTTP/1.1\r\nHost: x\r\ncontent-type: application/grpc\r\ncontent-length: 5\r\n\r\n\0\0\0\0\0"
                .to_vec(),
            false,
            None,
        ),
        ("a truncated preface", PREFACE[..14].to_vec(), true, None),
        ("a corrupt preface", b"PRI * HTTP/2.0\r\n\r\nXX\r\n\r\n".to_vec(), false, None),
        (
            "a SETTINGS frame of 5 bytes",
            with_preface(&[h2_frame(4, 0, 0, &[0, 3, 0, 0, 0])]),
            false,
            // RFC 9113 names FRAME_SIZE_ERROR here; h2 answers PROTOCOL_ERROR.
            Some(H2_PROTOCOL_ERROR),
        ),
        (
            "DATA on stream 0",
            with_preface(&[h2_frame(0, 0, 0, b"hello")]),
            false,
            Some(H2_PROTOCOL_ERROR),
        ),
        (
            "HEADERS with a garbage HPACK block",
            with_preface(&[h2_frame(1, 0x4 | 0x1, 1, &[0xff; 32])]),
            false,
            // RFC 9113 names COMPRESSION_ERROR here; h2 answers PROTOCOL_ERROR.
            Some(H2_PROTOCOL_ERROR),
        ),
        (
            "a frame header announcing 16 MiB",
            {
                let mut b = with_preface(&[]);
                b.extend_from_slice(&[0xff, 0xff, 0xff, 0, 0, 0, 0, 0, 1]);
                b.extend_from_slice(&junk(1024, 3));
                b
            },
            false,
            Some(H2_FRAME_SIZE_ERROR),
        ),
    ];
    for (what, bytes, half_close, goaway) in cases {
        let h = hostile_connection(addr, &bytes, half_close);
        eprintln!("{addr} {what}: {h:?}");
        if !h.closed {
            f.0.push(format!("{addr} {what}: the connection was kept open: {h:?}"));
        }
        if goaway.is_some() && h.goaway != goaway {
            f.0.push(format!(
                "{addr} {what}: GOAWAY {:?}, expected {goaway:?}",
                h.goaway
            ));
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The processes and their data.

fn assert_running(p: &mut Proc, role: &str) {
    assert!(
        p.child.try_wait().unwrap().is_none(),
        "the {role} exited; stderr:\n{}",
        p.stderr_text()
    );
    let err = p.stderr_text();
    assert!(!err.contains("panicked"), "the {role} panicked:\n{err}");
}

async fn versions(dir: &str, prod: &str) -> (String, String) {
    let d = pb::directory_client::DirectoryClient::new(channel(dir).await)
        .version(pb::VersionRequest {})
        .await
        .unwrap()
        .into_inner();
    let p = pb::producer_client::ProducerClient::new(channel(prod).await)
        .version(pb::VersionRequest {})
        .await
        .unwrap()
        .into_inner();
    (d.role, p.role)
}

/// Every record in the directory, with what must not change.
async fn records(dir: &str) -> Vec<(pb::Record, u64, u64)> {
    let mut c = gma_consumer::directory::client(dir).await.unwrap();
    let (mut entries, _) = gma_consumer::directory::search_all(&mut c, pb::SearchRequest::default())
        .await
        .unwrap();
    entries.sort_by_key(|e| e.create_revision);
    entries
        .into_iter()
        .map(|e| (e.record.unwrap(), e.lease_id, e.create_revision))
        .collect()
}

/// The latest `name` event of `source`, as `gma query` prints it.
fn query(prod: &str, name: &str, source: &str) -> serde_json::Value {
    let r = gma(
        &[
            "query",
            name,
            "--producer",
            prod,
            "--source",
            source,
            "--output",
            "json",
        ],
        Duration::from_secs(10),
    );
    assert_eq!(r.code, 0, "gma query {name}: {}", r.stderr);
    let mut ev = json_lines(&r.stdout);
    assert_eq!(ev.len(), 1, "{ev:?}");
    ev.remove(0)
}

fn app_schema() -> pb::EventSchema {
    pb::EventSchema {
        name: "app.progress".into(),
        version: 1,
        fields: vec![
            gma_core::event::dbl("done", "", ""),
            gma_core::event::dbl("total", "", ""),
        ],
        description: String::new(),
    }
}

fn number(v: f64) -> pb::Value {
    pb::Value {
        kind: Some(pb::value::Kind::Number(v)),
    }
}

fn producer_record(id: &str) -> pb::Record {
    pb::Record {
        record: Some(pb::record::Record::Producer(pb::ProducerRecord {
            id: id.into(),
            address: "http://127.0.0.1:9".into(),
            events: vec!["host.load".into()],
            ..Default::default()
        })),
    }
}

// ---------------------------------------------------------------------------------------------
// The attacks.

async fn malformed_protobufs(dir: &str, prod: &str, f: &mut Findings) {
    let d = channel(dir).await;
    let p = channel(prod).await;
    const DECODE: &str = "failed to decode Protobuf message";
    let search = pb::SearchRequest {
        event_pattern: "host.*".into(),
        source: "hostA".into(),
        ..Default::default()
    };
    let register = pb::RegisterRequest {
        record: Some(producer_record("evil")),
        schemas: vec![],
        lease_ttl_ms: 0,
    };
    let watch = pb::WatchRequest {
        from_revision: 0,
        kind: 0,
        event_pattern: "host.*".into(),
    };
    let q = pb::QueryRequest {
        patterns: vec!["host.load".into()],
        sources: vec!["hostA".into()],
        max_age_ms: 0,
        ..Default::default()
    };
    let sub = pb::SubscribeRequest {
        patterns: vec!["host.load".into()],
        consumer_id: "evil".into(),
        ..Default::default()
    };
    let push = pb::IngestRequest {
        events: vec![pb::Event {
            name: "app.progress".into(),
            source: "app1".into(),
            values: vec![number(66.0), number(66.0)],
            ..Default::default()
        }],
        schemas: vec![],
    };
    let sim = pb::SimSetRequest {
        host: "hostA".into(),
        values: [("load".to_string(), 66.0)].into(),
    };
    let raft = gma_proto::raft::RaftRequest {
        data: br#"{"truncated":"never decoded"}"#.to_vec(),
    };
    // Truncated mid-field.
    let truncated_cases: Vec<(&Channel, &str, Vec<u8>)> = vec![
        (&d, "/gma.v1.Directory/Search", truncated(&search, 2)),
        (&d, "/gma.v1.Directory/Register", truncated(&register, 3)),
        (
            &d,
            "/gma.v1.Directory/Update",
            truncated(
                &pb::UpdateRequest {
                    record: register.record.clone(),
                    ..Default::default()
                },
                3,
            ),
        ),
        (&d, "/gma.v1.Directory/Watch", truncated(&watch, 2)),
        (
            &d,
            "/gma.v1.Directory/GetSchema",
            truncated(
                &pb::GetSchemaRequest {
                    name: "host.load".into(),
                    version: 0,
                },
                2,
            ),
        ),
        (
            &d,
            "/gma.v1.Directory/Remove",
            truncated(
                &pb::RemoveRequest {
                    kind: 1,
                    id: "evil-record".into(),
                },
                2,
            ),
        ),
        (&d, "/gma.raft.v1.Raft/Vote", truncated(&raft, 4)),
        (&p, "/gma.v1.Producer/Query", truncated(&q, 2)),
        (&p, "/gma.v1.Producer/Subscribe", truncated(&sub, 2)),
        (
            &p,
            "/gma.v1.Producer/Unsubscribe",
            truncated(
                &pb::UnsubscribeRequest {
                    subscription_id: 300,
                    ..Default::default()
                },
                1,
            ),
        ),
        (&p, "/gma.v1.Ingest/Push", truncated(&push, 3)),
        (&p, "/gma.v1.Simulator/Set", truncated(&sim, 3)),
    ];
    for (ch, path, bytes) in truncated_cases {
        let r = call_raw(ch, path, bytes).await;
        f.status(&format!("truncated {path}"), r, Code::InvalidArgument, DECODE);
    }
    // A stream of KeepAlives whose message is truncated (a varint cut short).
    let r = call_raw(
        &d,
        "/gma.v1.Directory/KeepAlive",
        truncated(&pb::KeepAliveRequest { lease_id: 300 }, 1),
    )
    .await;
    f.status(
        "truncated /gma.v1.Directory/KeepAlive",
        r,
        Code::InvalidArgument,
        DECODE,
    );

    // Other malformed encodings.
    let mut deep = Vec::new();
    for _ in 0..100_000 {
        // Field 99, wire type 3 (start group), never ended: nested unknown groups.
        deep.extend_from_slice(&[0x9b, 0x06]);
    }
    let other: Vec<(&Channel, &str, &str, Vec<u8>)> = vec![
        (
            &d,
            "/gma.v1.Directory/Search",
            "wire type 7",
            undecodable::<pb::SearchRequest>(vec![0x0f, 1]),
        ),
        (
            &d,
            "/gma.v1.Directory/Search",
            "field number 0",
            undecodable::<pb::SearchRequest>(vec![0x02, 1, b'x']),
        ),
        (
            &d,
            "/gma.v1.Directory/Search",
            "a string field sent as a varint",
            undecodable::<pb::SearchRequest>(vec![0x10, 1]),
        ),
        (
            &d,
            "/gma.v1.Directory/Search",
            "a length of 4 GiB",
            undecodable::<pb::SearchRequest>(vec![0x12, 0xff, 0xff, 0xff, 0xff, 0x0f, b'h']),
        ),
        (
            &d,
            "/gma.v1.Directory/Register",
            "random bytes",
            undecodable::<pb::RegisterRequest>(junk(1024, 11)),
        ),
        (
            &d,
            "/gma.v1.Directory/Search",
            "100000 nested groups",
            undecodable::<pb::SearchRequest>(deep.clone()),
        ),
        (
            &p,
            "/gma.v1.Producer/Subscribe",
            "100000 nested groups",
            undecodable::<pb::SubscribeRequest>(deep.clone()),
        ),
        (
            &p,
            "/gma.v1.Ingest/Push",
            "100000 nested groups",
            undecodable::<pb::IngestRequest>(deep),
        ),
        (
            &p,
            "/gma.v1.Producer/Query",
            "random bytes",
            undecodable::<pb::QueryRequest>(junk(1024, 5)),
        ),
    ];
    for (ch, path, what, bytes) in other {
        let r = call_raw(ch, path, bytes).await;
        f.status(&format!("{what} to {path}"), r, Code::InvalidArgument, DECODE);
    }

    // Malformed UTF-8 in string fields, top level and nested.
    let bad: &[&[u8]] = &[&[0xff, 0xfe], &[0xc3, 0x28], &[0xed, 0xa0, 0x80], &[0xc0, 0x80]];
    let producer_with_bad_id = ld(1, &ld(1, &[b"ok".as_slice(), bad[1]].concat()));
    let utf8: Vec<(&Channel, &str, Vec<u8>)> = vec![
        (&d, "/gma.v1.Directory/Search", ld(2, bad[0])),
        (&d, "/gma.v1.Directory/Search", ld(3, bad[2])),
        (&d, "/gma.v1.Directory/Register", ld(1, &producer_with_bad_id)),
        (&d, "/gma.v1.Directory/Watch", ld(3, bad[3])),
        (&d, "/gma.v1.Directory/GetSchema", ld(1, bad[0])),
        (&p, "/gma.v1.Producer/Query", ld(1, bad[2])),
        (
            &p,
            "/gma.v1.Producer/Subscribe",
            [ld(1, b"host.load"), ld(10, bad[1])].concat(),
        ),
        (
            &p,
            "/gma.v1.Ingest/Push",
            ld(1, &[ld(1, b"app.progress"), ld(2, bad[0])].concat()),
        ),
        (
            &p,
            "/gma.v1.Simulator/Set",
            [ld(1, b"hostA"), ld(2, &ld(1, bad[3]))].concat(),
        ),
        (&p, "/gma.v1.Control/SetPeriod", ld(1, bad[0])),
        (&p, "/gma.v1.Control/Watch", ld(1, bad[2])),
    ];
    for (ch, path, bytes) in utf8 {
        let r = call_raw(ch, path, bytes).await;
        f.status(
            &format!("invalid UTF-8 to {path}"),
            r,
            Code::InvalidArgument,
            "not UTF-8",
        );
    }
    // Valid UTF-8 that no name may hold: NUL and control characters.
    let mut dc = pb::directory_client::DirectoryClient::new(d.clone());
    let r = dc
        .search(pb::SearchRequest {
            event_pattern: "host\0.load".into(),
            ..Default::default()
        })
        .await;
    f.status("NUL in a Search pattern", r, Code::InvalidArgument, "position 4");
    let mut pc = pb::producer_client::ProducerClient::new(p.clone());
    let r = pc
        .query(pb::QueryRequest {
            patterns: vec!["host.load".into()],
            sources: vec!["hostA\u{1b}[2J".into()],
            max_age_ms: 0,
            ..Default::default()
        })
        .await;
    f.status(
        "an escape sequence in a Query source",
        r,
        Code::InvalidArgument,
        "position 5",
    );
}

async fn lying_frames(dir: &str, prod: &str, f: &mut Findings) {
    let d = channel(dir).await;
    let p = channel(prod).await;
    let search = pb::SearchRequest {
        event_pattern: "host.*".into(),
        ..Default::default()
    }
    .encode_to_vec();
    let limit = format!("the limit is: {MAX} bytes");
    let raft_limit = format!("the limit is: {} bytes", MAX * 16);
    let cases = vec![
        (
            &d,
            "/gma.v1.Directory/Search",
            "a length prefix of 256 over 8 bytes",
            grpc_frame(0, 256, &search),
            Code::Internal,
            "Unexpected EOF",
        ),
        (
            &p,
            "/gma.v1.Producer/Subscribe",
            "a length prefix of 256 over 11 bytes",
            grpc_frame(0, 256, b"\x0a\x09host.load"),
            Code::Internal,
            "Unexpected EOF",
        ),
        (
            &d,
            "/gma.v1.Directory/Search",
            "half a frame header",
            vec![0, 0, 0],
            Code::Internal,
            "Unexpected EOF",
        ),
        (
            &d,
            "/gma.v1.Directory/Search",
            "no message at all",
            vec![],
            Code::Internal,
            "Missing request message",
        ),
        (
            &p,
            "/gma.v1.Producer/Query",
            "no message at all",
            vec![],
            Code::Internal,
            "Missing request message",
        ),
        (
            &d,
            "/gma.v1.Directory/Search",
            "a length prefix of 4 MiB + 1",
            grpc_frame(0, MAX as u32 + 1, &search),
            Code::OutOfRange,
            limit.as_str(),
        ),
        (
            &p,
            "/gma.v1.Ingest/Push",
            "a length prefix of 2 GiB",
            grpc_frame(0, 0x7f7f_7f7f, b"x"),
            Code::OutOfRange,
            limit.as_str(),
        ),
        (
            &d,
            "/gma.raft.v1.Raft/AppendEntries",
            "a length prefix of 64 MiB + 1",
            grpc_frame(0, (MAX * 16) as u32 + 1, b"x"),
            Code::OutOfRange,
            raft_limit.as_str(),
        ),
        (
            &d,
            "/gma.v1.Directory/Search",
            "the compressed flag without grpc-encoding",
            grpc_frame(1, search.len() as u32, &search),
            Code::Internal,
            "compressed-flag but no grpc-encoding",
        ),
        (
            &p,
            "/gma.v1.Producer/Query",
            "compression flag 7",
            grpc_frame(7, 3, b"abc"),
            Code::Internal,
            "invalid compression flag: 7",
        ),
        (
            &d,
            "/gma.v1.Directory/Nope",
            "an unknown method",
            grpc_frame(0, search.len() as u32, &search),
            Code::Unimplemented,
            "",
        ),
        (
            &p,
            "/evil.v9.Backdoor/Open",
            "an unknown service",
            grpc_frame(0, 0, b""),
            Code::Unimplemented,
            "",
        ),
    ];
    for (ch, path, what, body, code, text) in cases {
        let s = call_frames(ch, path, body, &[]).await;
        // Unimplemented carries no message in tonic: the code is the precise answer.
        if code == Code::Unimplemented {
            eprintln!("{what} to {path}: {:?}", s.code());
            if s.code() != code {
                f.0.push(format!("{what} to {path}: got {s:?}, expected {code:?}"));
            }
        } else {
            f.check(&format!("{what} to {path}"), &s, code, text);
        }
    }
    // A compression the servers do not accept.
    let s = call_frames(
        &d,
        "/gma.v1.Directory/Search",
        grpc_frame(1, 5, b"\x1f\x0b\x08\0\0"),
        &[("grpc-encoding", "br0tli-bomb")],
    )
    .await;
    f.check(
        "grpc-encoding br0tli-bomb to Search",
        &s,
        Code::Unimplemented,
        "br0tli-bomb",
    );
    let s = call_frames(
        &p,
        "/gma.v1.Producer/Query",
        grpc_frame(1, 5, b"\x1f\x0b\x08\0\0"),
        &[("grpc-encoding", "gzip")],
    )
    .await;
    f.check("grpc-encoding gzip to Query", &s, Code::Unimplemented, "gzip");

    // Messages over MAX_MESSAGE_BYTES, really sent.
    let big = |field: u8| ld(field, &b"a".repeat(5 * MIB));
    let oversized: Vec<(&Channel, &str, Vec<u8>)> = vec![
        (&d, "/gma.v1.Directory/Search", big(3)),
        (&d, "/gma.v1.Directory/Watch", big(3)),
        (&d, "/gma.v1.Directory/Register", ld(1, &big(1))),
        (&p, "/gma.v1.Producer/Query", big(1)),
        (&p, "/gma.v1.Producer/Subscribe", big(1)),
        (&p, "/gma.v1.Simulator/Set", big(1)),
    ];
    for (ch, path, bytes) in oversized {
        let r = call_raw(ch, path, bytes).await;
        f.status(&format!("5 MiB to {path}"), r, Code::OutOfRange, &limit);
    }
    // Valid protobuf, garbage inside: the raft payload is JSON.
    let r = call_raw(
        &d,
        "/gma.raft.v1.Raft/AppendEntries",
        gma_proto::raft::RaftRequest { data: junk(512, 9) }.encode_to_vec(),
    )
    .await;
    f.status(
        "junk JSON in a raft AppendEntries",
        r,
        Code::InvalidArgument,
        "malformed raft message",
    );
}

async fn huge_patterns(dir: &str, prod: &str, f: &mut Findings) {
    // A fresh connection for every call: a failure that takes its connection down must not
    // pass for the next call's.
    let dc = || async { pb::directory_client::DirectoryClient::new(channel(dir).await) };
    let pc = || async {
        pb::producer_client::ProducerClient::new(channel(prod).await).max_decoding_message_size(MAX)
    };
    let ic = || async { pb::ingest_client::IngestClient::new(channel(prod).await) };
    let sc = || async { pb::simulator_client::SimulatorClient::new(channel(prod).await) };
    let huge = || "a".repeat(MIB);
    let huge_glob = || "*a".repeat(MIB / 2);
    const TOO_LONG: &str = "longer than 256 bytes";

    let r = dc()
        .await
        .search(pb::SearchRequest {
            event_pattern: huge_glob(),
            ..Default::default()
        })
        .await;
    f.status("1 MiB Search event_pattern", r, Code::InvalidArgument, TOO_LONG);
    let r = dc()
        .await
        .search(pb::SearchRequest {
            source: huge(),
            ..Default::default()
        })
        .await;
    f.status("1 MiB Search source", r, Code::InvalidArgument, TOO_LONG);
    let r = dc()
        .await
        .search(pb::SearchRequest {
            page_token: huge(),
            ..Default::default()
        })
        .await;
    f.status("1 MiB Search page_token", r, Code::InvalidArgument, "token");
    let r = dc()
        .await
        .watch(pb::WatchRequest {
            event_pattern: huge_glob(),
            ..Default::default()
        })
        .await;
    f.status("1 MiB Watch event_pattern", r, Code::InvalidArgument, TOO_LONG);
    let r = dc()
        .await
        .get_schema(pb::GetSchemaRequest {
            name: huge(),
            version: 0,
        })
        .await;
    f.status("1 MiB GetSchema name", r, Code::InvalidArgument, TOO_LONG);
    let r = dc()
        .await
        .register(pb::RegisterRequest {
            record: Some(producer_record(&huge())),
            schemas: vec![],
            lease_ttl_ms: 0,
        })
        .await;
    f.status(
        "1 MiB Register id",
        r,
        Code::InvalidArgument,
        "id is longer than 256 bytes",
    );
    let r = dc()
        .await
        .remove(pb::RemoveRequest {
            kind: pb::RecordKind::Producer as i32,
            id: huge(),
        })
        .await;
    f.status(
        "1 MiB Remove id",
        r,
        Code::InvalidArgument,
        "id is longer than 256 bytes",
    );
    let mut rec = producer_record("huge-events");
    if let Some(pb::record::Record::Producer(p)) = &mut rec.record {
        p.events = vec![huge()];
    }
    let r = dc()
        .await
        .register(pb::RegisterRequest {
            record: Some(rec),
            schemas: vec![],
            lease_ttl_ms: 0,
        })
        .await;
    f.status("1 MiB event name in Register", r, Code::InvalidArgument, TOO_LONG);
    let mut rec = producer_record("huge-attribute");
    if let Some(pb::record::Record::Producer(p)) = &mut rec.record {
        p.attributes.insert(huge(), "v".into());
    }
    let r = dc()
        .await
        .register(pb::RegisterRequest {
            record: Some(rec),
            schemas: vec![],
            lease_ttl_ms: 0,
        })
        .await;
    f.status(
        "1 MiB attribute key in Register",
        r,
        Code::InvalidArgument,
        "1-256 bytes",
    );
    let r = dc()
        .await
        .register(pb::RegisterRequest {
            record: Some(pb::Record {
                record: Some(pb::record::Record::Consumer(pb::ConsumerRecord {
                    id: "huge-accepts".into(),
                    address: "http://127.0.0.1:9".into(),
                    accepts: vec![huge_glob()],
                    ..Default::default()
                })),
            }),
            schemas: vec![],
            lease_ttl_ms: 0,
        })
        .await;
    f.status(
        "1 MiB consumer accepts pattern in Register",
        r,
        Code::InvalidArgument,
        TOO_LONG,
    );

    let r = pc()
        .await
        .query(pb::QueryRequest {
            patterns: vec![huge_glob()],
            ..Default::default()
        })
        .await;
    f.status("1 MiB Query pattern", r, Code::InvalidArgument, TOO_LONG);
    let r = pc()
        .await
        .query(pb::QueryRequest {
            patterns: vec!["host.load".into()],
            sources: vec![huge()],
            max_age_ms: 0,
            ..Default::default()
        })
        .await;
    f.status("1 MiB Query source", r, Code::InvalidArgument, TOO_LONG);
    // 100 000 patterns: over the per-request limit.
    let r = pc()
        .await
        .query(pb::QueryRequest {
            patterns: (0..100_000).map(|i| format!("no.such.event{i}")).collect(),
            ..Default::default()
        })
        .await;
    f.status(
        "100000 Query patterns",
        r,
        Code::InvalidArgument,
        "at most 1024 are accepted",
    );
    // 1 000 patterns matching nothing: the answer names them, but stays one short answer.
    let r = pc()
        .await
        .query(pb::QueryRequest {
            patterns: (0..1000).map(|i| format!("no.such.event{i}")).collect(),
            ..Default::default()
        })
        .await;
    f.status("1000 Query patterns", r, Code::NotFound, "no event available");
    let r = pc()
        .await
        .subscribe(pb::SubscribeRequest {
            patterns: vec![huge_glob()],
            ..Default::default()
        })
        .await;
    f.status("1 MiB Subscribe pattern", r, Code::InvalidArgument, TOO_LONG);
    let r = pc()
        .await
        .subscribe(pb::SubscribeRequest {
            patterns: vec!["host.load".into()],
            when: format!("load1 > {}", "9".repeat(MIB)),
            ..Default::default()
        })
        .await;
    f.status(
        "1 MiB Subscribe when",
        r,
        Code::InvalidArgument,
        "when: longer than 4096 bytes",
    );
    let r = pc()
        .await
        .subscribe(pb::SubscribeRequest {
            patterns: vec!["host.load".into()],
            summaries: vec![huge()],
            ..Default::default()
        })
        .await;
    f.status(
        "1 MiB Subscribe summary window",
        r,
        Code::InvalidArgument,
        "summary window",
    );
    let r = pc()
        .await
        .subscribe(pb::SubscribeRequest {
            patterns: vec!["host.load".into()],
            consumer_id: huge(),
            ..Default::default()
        })
        .await;
    f.status(
        "1 MiB Subscribe consumer_id",
        r,
        Code::InvalidArgument,
        "consumer_id longer than 256 bytes",
    );
    let r = ic()
        .await
        .push(pb::IngestRequest {
            events: vec![pb::Event {
                name: huge(),
                source: "app1".into(),
                values: vec![number(1.0)],
                ..Default::default()
            }],
            schemas: vec![],
        })
        .await;
    f.status("1 MiB Push event name", r, Code::InvalidArgument, "event 0");
    let r = ic()
        .await
        .schema(pb::GetSchemaRequest {
            name: huge(),
            version: 0,
        })
        .await;
    f.status("1 MiB Ingest.Schema name", r, Code::InvalidArgument, TOO_LONG);
    let r = ic()
        .await
        .push(pb::IngestRequest {
            events: vec![pb::Event {
                name: "app.progress".into(),
                source: huge(),
                values: vec![number(1.0), number(2.0)],
                ..Default::default()
            }],
            schemas: vec![],
        })
        .await;
    f.status("1 MiB Push source", r, Code::InvalidArgument, TOO_LONG);
    let mut schema = app_schema();
    schema.name = format!("app.{}", huge());
    let r = ic()
        .await
        .push(pb::IngestRequest {
            events: vec![],
            schemas: vec![schema],
        })
        .await;
    f.status("1 MiB Push schema name", r, Code::InvalidArgument, TOO_LONG);
    let r = sc()
        .await
        .set(pb::SimSetRequest {
            host: huge(),
            values: [("load".to_string(), 1.0)].into(),
        })
        .await;
    f.status("1 MiB Sim host", r, Code::NotFound, "no simulated host");
    let r = sc()
        .await
        .set(pb::SimSetRequest {
            host: "hostA".into(),
            values: [(huge(), 1.0)].into(),
        })
        .await;
    f.status("1 MiB Sim key", r, Code::InvalidArgument, "unknown key");
    // Huge request metadata: far over the servers' 16 KiB header list limit, refused by HTTP/2
    // itself (h2 closes the connection with GOAWAY ENHANCE_YOUR_CALM, which the client sees as
    // RESOURCE_EXHAUSTED or a transport error, depending on timing); the service never runs.
    let mut req = tonic::Request::new(pb::VersionRequest {});
    req.metadata_mut()
        .insert("x-evil", "a".repeat(MIB).parse().unwrap());
    let r = dc().await.version(req).await;
    match r {
        Ok(_) => f.0.push("1 MiB of metadata: accepted".into()),
        Err(s) => eprintln!("1 MiB of metadata: {:?} {:?}", s.code(), s.message()),
    }
}

/// Opens `n` subscriptions on one connection; returns the open streams and the refusals.
async fn open_subscriptions(
    ch: &Channel,
    n: usize,
) -> (Vec<tonic::Streaming<pb::SubscribeResponse>>, Vec<Status>) {
    let mut pc = pb::producer_client::ProducerClient::new(ch.clone()).max_decoding_message_size(MAX);
    let mut open = Vec::new();
    let mut refused = Vec::new();
    for _ in 0..n {
        let r = pc
            .subscribe(pb::SubscribeRequest {
                patterns: vec!["host.load".into()],
                ..Default::default()
            })
            .await;
        match r {
            Ok(s) => open.push(s.into_inner()),
            Err(s) => refused.push(s),
        }
    }
    (open, refused)
}

async fn open_watches(ch: &Channel, n: usize) -> (Vec<tonic::Streaming<pb::WatchEvent>>, Vec<Status>) {
    let mut dc = pb::directory_client::DirectoryClient::new(ch.clone()).max_decoding_message_size(MAX);
    let mut open = Vec::new();
    let mut refused = Vec::new();
    for _ in 0..n {
        let r = dc
            .watch(pb::WatchRequest {
                from_revision: 0,
                ..Default::default()
            })
            .await;
        match r {
            Ok(s) => open.push(s.into_inner()),
            Err(s) => refused.push(s),
        }
    }
    (open, refused)
}

const PRODUCER_SUBS: usize = 8;
const DIRECTORY_WATCHES: usize = 16;

/// Subscription floods against the per-connection limits (`[limits]
/// subscriptions_per_connection`).
async fn many_subscriptions(dir: &str, prod: &str, f: &mut Findings) {
    // The producer: 40 subscriptions on one connection, limit 8.
    let p = channel(prod).await;
    let (mut open, refused) = open_subscriptions(&p, 40).await;
    eprintln!(
        "40 Subscribe on one connection: {} open, {} refused {:?}",
        open.len(),
        refused.len(),
        refused.first()
    );
    if open.len() != PRODUCER_SUBS || refused.len() != 40 - PRODUCER_SUBS {
        f.0.push(format!(
            "40 Subscribe on one connection with subscriptions_per_connection = {PRODUCER_SUBS}: {} open, {} refused",
            open.len(),
            refused.len()
        ));
    }
    for s in &refused {
        if s.code() != Code::ResourceExhausted || !s.message().contains(&format!("limit {PRODUCER_SUBS}")) {
            f.0.push(format!("a refused Subscribe: {s:?}"));
        }
    }
    // The open ones deliver.
    for s in open.iter_mut().take(PRODUCER_SUBS) {
        let m = tokio::time::timeout(Duration::from_secs(10), s.message()).await;
        if !matches!(m, Ok(Ok(Some(_)))) {
            f.0.push(format!("an admitted subscription did not deliver: {m:?}"));
        }
    }
    // Another connection has its own allowance, and closing streams frees slots.
    let p2 = channel(prod).await;
    let (more, refused2) = open_subscriptions(&p2, 1).await;
    if more.len() != 1 {
        f.0.push(format!("a second connection could not subscribe: {refused2:?}"));
    }
    drop(open);
    let reopened = poll_for(Duration::from_secs(5), || async {
        let (o, refused) = open_subscriptions(&p, 1).await;
        if o.len() == 1 {
            Ok(())
        } else {
            Err(format!("{refused:?}"))
        }
    })
    .await;
    if let Err(last) = reopened {
        f.0.push(format!(
            "closing every subscription of a connection did not free a slot (last refusal: {last})"
        ));
    }
    // Many connections each at the limit: the producer keeps up.
    let mut held = Vec::new();
    for _ in 0..10 {
        let ch = channel(prod).await;
        let (o, r) = open_subscriptions(&ch, PRODUCER_SUBS).await;
        if !r.is_empty() {
            f.0.push(format!(
                "within the limit on a fresh connection, refused: {:?}",
                r[0]
            ));
        }
        held.push((ch, o));
    }

    // The directory: 300 Watch streams on one connection, limit 16.
    let d = channel(dir).await;
    let (mut open, refused) = open_watches(&d, 300).await;
    eprintln!(
        "300 Watch on one connection: {} open, {} refused {:?}",
        open.len(),
        refused.len(),
        refused.first()
    );
    if open.len() != DIRECTORY_WATCHES || refused.len() != 300 - DIRECTORY_WATCHES {
        f.0.push(format!(
            "300 Watch on one connection with subscriptions_per_connection = {DIRECTORY_WATCHES}: {} open, {} refused",
            open.len(),
            refused.len()
        ));
    }
    for s in &refused {
        if s.code() != Code::ResourceExhausted || !s.message().contains(&format!("limit {DIRECTORY_WATCHES}"))
        {
            f.0.push(format!("a refused Watch: {s:?}"));
            break;
        }
    }
    for s in open.iter_mut() {
        let m = tokio::time::timeout(Duration::from_secs(10), s.message()).await;
        if !matches!(m, Ok(Ok(Some(_)))) {
            f.0.push(format!("an admitted Watch did not deliver: {m:?}"));
        }
    }
    drop(open);
    let reopened = poll_for(Duration::from_secs(5), || async {
        let (o, refused) = open_watches(&d, 1).await;
        if o.len() == 1 {
            Ok(())
        } else {
            Err(format!("{refused:?}"))
        }
    })
    .await;
    if let Err(last) = reopened {
        f.0.push(format!(
            "closing every Watch of a connection did not free a slot (last refusal: {last})"
        ));
    }
    drop(held);
    drop(more);
}

// ---------------------------------------------------------------------------------------------

#[test]
fn hostile_input_gets_precise_statuses_and_the_data_survives() {
    let tmp = tempdir();
    let dcfg = tmp.path().join("directory.toml");
    std::fs::write(
        &dcfg,
        format!(
            // rpc_events_ms = 0: no gma.rpc companion and no gma.rpc sources: this test
            // compares the directory's records byte for byte before and after the attack, and
            // self-monitoring legitimately adds a source per newly called method.
            "data_dir = {:?}\nrpc_events_ms = 0\n[limits]\nsubscriptions_per_connection = {DIRECTORY_WATCHES}\n",
            tmp.path().join("d").to_str().unwrap()
        ),
    )
    .unwrap();
    let mut dir = Proc::start(
        &[
            "directory",
            "--listen",
            "127.0.0.1:0",
            "--config",
            dcfg.to_str().unwrap(),
        ],
        "gma directory listening on",
    );
    let sim = tmp.path().join("sim.toml");
    std::fs::write(
        &sim,
        "period_ms = 100\n[[host]]\nname = \"hostA\"\ncpus = 8\nmemory_mb = 1024\nload = 0.5\n",
    )
    .unwrap();
    let pcfg = tmp.path().join("producer.toml");
    std::fs::write(
        &pcfg,
        format!("rpc_events_ms = 0\n[limits]\nsubscriptions_per_connection = {PRODUCER_SUBS}\n"),
    )
    .unwrap();
    let mut prod = Proc::producer(&[
        "--config",
        pcfg.to_str().unwrap(),
        "--no-host-sensors",
        "--simulate",
        sim.to_str().unwrap(),
        "--directory",
        &dir.addr,
    ]);
    let rt = tokio::runtime::Runtime::new().unwrap();

    // Before: application data pushed into the producer, an extra record in the directory;
    // wait until the producer's record lists its sources and events.
    rt.block_on(async {
        let mut ic = pb::ingest_client::IngestClient::new(channel(&prod.addr).await);
        let ok = ic
            .push(pb::IngestRequest {
                events: vec![pb::Event {
                    name: "app.progress".into(),
                    source: "app1".into(),
                    values: vec![number(3.0), number(7.0)],
                    ..Default::default()
                }],
                schemas: vec![app_schema()],
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(ok.accepted, 1);
    });
    let settled = wait_until(Duration::from_secs(30), || {
        rt.block_on(records(&dir.addr)).iter().any(|(r, _, _)| {
            matches!(&r.record, Some(pb::record::Record::Producer(p))
                if p.id != "extra-record"
                    && p.sources.iter().any(|s| s == "hostA")
                    && p.events.iter().any(|e| e == "app.progress"))
        })
    });
    assert!(
        settled,
        "the producer's record never listed hostA and app.progress: {:#?}",
        rt.block_on(records(&dir.addr))
    );
    // The extra record's events have schemas in the directory once the producer registered.
    rt.block_on(async {
        let mut dc = gma_consumer::directory::client(&dir.addr).await.unwrap();
        dc.register(pb::RegisterRequest {
            record: Some(producer_record("extra-record")),
            schemas: vec![],
            lease_ttl_ms: 3_600_000,
        })
        .await
        .unwrap();
    });
    let records_before = rt.block_on(records(&dir.addr));
    assert_eq!(records_before.len(), 2, "{records_before:#?}");
    let mut ids_before = search_ids(&dir.addr, "*").unwrap();
    ids_before.sort();
    let load_before = query(&prod.addr, "host.load", "hostA");
    let app_before = query(&prod.addr, "app.progress", "app1");
    let seq_before = load_before["seq"].as_u64().unwrap();

    // The attack.
    let mut f = Findings::default();
    let idle: Vec<TcpStream> = (0..64)
        .flat_map(|_| [&dir.addr, &prod.addr])
        .map(|a| {
            let mut s = TcpStream::connect(a).unwrap();
            s.write_all(&PREFACE[..10]).unwrap();
            s
        })
        .collect();
    for addr in [&dir.addr, &prod.addr] {
        garbage_connections(addr, &mut f);
    }
    let roles = rt.block_on(versions(&dir.addr, &prod.addr));
    assert_eq!(roles, ("directory".to_string(), "producer".to_string()));
    assert_running(&mut dir, "directory");
    assert_running(&mut prod, "producer");

    rt.block_on(malformed_protobufs(&dir.addr, &prod.addr, &mut f));
    assert_running(&mut dir, "directory");
    assert_running(&mut prod, "producer");
    rt.block_on(lying_frames(&dir.addr, &prod.addr, &mut f));
    assert_running(&mut dir, "directory");
    assert_running(&mut prod, "producer");
    rt.block_on(huge_patterns(&dir.addr, &prod.addr, &mut f));
    assert_running(&mut dir, "directory");
    assert_running(&mut prod, "producer");
    rt.block_on(many_subscriptions(&dir.addr, &prod.addr, &mut f));
    assert_running(&mut dir, "directory");
    assert_running(&mut prod, "producer");
    drop(idle);

    // After: both still serve, and hold what they held.
    let roles = rt.block_on(versions(&dir.addr, &prod.addr));
    assert_eq!(roles, ("directory".to_string(), "producer".to_string()));
    let records_after = rt.block_on(records(&dir.addr));
    assert_eq!(records_after, records_before, "the directory's records changed");
    let mut ids_after = search_ids(&dir.addr, "*").unwrap();
    ids_after.sort();
    assert_eq!(ids_after, ids_before);
    let app_after = query(&prod.addr, "app.progress", "app1");
    assert_eq!(app_after, app_before, "the pushed application event changed");
    let load_after = query(&prod.addr, "host.load", "hostA");
    assert_eq!(
        load_after["values"], load_before["values"],
        "the simulated host's values changed"
    );
    assert!(load_after["seq"].as_u64().unwrap() > seq_before);
    // New events keep coming, in seq order, after everything held before.
    let r = gma(
        &[
            "subscribe",
            "host.load",
            "--producer",
            &prod.addr,
            "--source",
            "hostA",
            "--count",
            "3",
            "--output",
            "json",
        ],
        Duration::from_secs(30),
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    let seqs: Vec<u64> = json_lines(&r.stdout)
        .iter()
        .map(|e| e["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(seqs.len(), 3, "{}", r.stdout);
    assert!(
        seqs[0] > seq_before && seqs.windows(2).all(|w| w[0] < w[1]),
        "{seqs:?} after {seq_before}"
    );
    let r = gma(
        &["search", "host.load", "--directory", &dir.addr],
        Duration::from_secs(10),
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(r.stdout.contains("extra-record"), "{}", r.stdout);
    assert_running(&mut dir, "directory");
    assert_running(&mut prod, "producer");

    // Reported last, so one run names every imprecise answer.
    assert!(
        f.0.is_empty(),
        "imprecise answers to hostile input:\n{}",
        f.0.join("\n")
    );
}
