//! `Producer.Subscribe` served without copying batches: the gRPC route in front of the
//! generated `Producer` server.
//!
//! A fan-out group encodes each chunk once and every member sends the same `Bytes`
//! ([`crate::subscription`]). Through tonic's encoder each member still copied the chunk into
//! its stream's buffer (the `SubscribeResponse` around it is written field by field into one
//! `BytesMut`): at 1 → 100 with 10,000-event batches that copy was a quarter of the
//! producer's CPU. Here a large batch goes to HTTP/2 as it is: one small frame with the gRPC
//! prefix and the response's own fields (subscription id, the batch's tag and length), then the
//! batch's bytes, which h2 writes from the shared buffer (a vectored write of its frame header
//! and the payload). Small batches are copied and joined, as tonic does (many small writes cost
//! more than the copy). The bytes on the wire are the ones tonic wrote: a `SubscribeResponse`
//! per batch, the same gRPC framing and trailers; a unit test checks them.
//!
//! Every other method goes to the generated server unchanged, and Subscribe runs the same
//! checks in the same order ([`ProducerService::open_subscription`]); the request is read with
//! tonic's limits and answers (compression refused, message size, an undecodable message is
//! `INVALID_ARGUMENT`).

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{BufMut, Bytes, BytesMut};
use gma_consumer::grpc_frames::Deframer;
use gma_proto::v1 as pb;
use gma_proto::wire::producer_server::ProducerServer;
use http_body::Frame;
use http_body_util::BodyExt;
use prost::Message;
use tokio::sync::mpsc;
use tonic::body::Body;
use tonic::codegen::{http, BoxFuture, Service};
use tonic::server::NamedService;
use tonic::Status;

use crate::service::{Opened, ProducerService};
use crate::subscription::Cancel;

/// The method served here; every other path of the service goes to the generated server.
pub const SUBSCRIBE_PATH: &str = "/gma.v1.Producer/Subscribe";

/// Batches at least this large are sent from their own buffer; smaller ones are copied and
/// joined with what else is ready, up to [`JOIN_BYTES`] per frame.
pub const ZERO_COPY_MIN: usize = 32 * 1024;

/// How many bytes of small batches one frame joins (tonic's own threshold for yielding its
/// buffer is 32 KiB).
const JOIN_BYTES: usize = 64 * 1024;

/// The gRPC message prefix (compression flag, big-endian length) and a `SubscribeResponse`'s
/// fields up to its batch's bytes: `subscription_id` (field 1, omitted when 0) and the tag and
/// length of `batch` (field 2, omitted when empty), as prost encodes them.
fn response_head(dst: &mut BytesMut, subscription_id: u64, batch_len: usize) {
    let mut fields = 0;
    if subscription_id != 0 {
        fields += 1 + prost::encoding::encoded_len_varint(subscription_id);
    }
    if batch_len > 0 {
        fields += 1 + prost::encoding::encoded_len_varint(batch_len as u64) + batch_len;
    }
    dst.reserve(5 + fields - batch_len);
    dst.put_u8(0);
    // A batch is at most the producer's own chunk, far below 4 GiB (MAX_MAX_BATCH events).
    dst.put_u32(u32::try_from(fields).unwrap_or(u32::MAX));
    if subscription_id != 0 {
        dst.put_u8(0x08);
        prost::encoding::encode_varint(subscription_id, dst);
    }
    if batch_len > 0 {
        dst.put_u8(0x12);
        prost::encoding::encode_varint(batch_len as u64, dst);
    }
}

/// The response body of one subscription: its messages as HTTP/2 data, then `grpc-status: 0`
/// when the stream ends (the subscription cancelled, or its task gone).
struct SubscribeBody {
    id: u64,
    rx: mpsc::Receiver<Bytes>,
    cancel: Arc<Cancel>,
    /// The connection's subscription slot, held while the stream is open.
    _slot: gma_core::guard::Slot,
    /// The first message (the subscription id, no batch) is still to send.
    first: bool,
    /// A large batch whose head went out in the last frame.
    batch: Option<Bytes>,
    ended: bool,
}

impl SubscribeBody {
    fn end(&mut self) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        self.ended = true;
        let mut trailers = http::HeaderMap::new();
        trailers.insert(Status::GRPC_STATUS, http::HeaderValue::from_static("0"));
        Poll::Ready(Some(Ok(Frame::trailers(trailers))))
    }
}

impl http_body::Body for SubscribeBody {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let this = self.get_mut();
        if this.ended {
            return Poll::Ready(None);
        }
        if let Some(batch) = this.batch.take() {
            return Poll::Ready(Some(Ok(Frame::data(batch))));
        }
        // Nothing is sent after an Unsubscribe has been confirmed.
        if this.cancel.is_cancelled() {
            return this.end();
        }
        let mut buf = BytesMut::new();
        if this.first {
            this.first = false;
            response_head(&mut buf, this.id, 0);
        }
        loop {
            let batch = match this.rx.poll_recv(cx) {
                Poll::Ready(Some(batch)) => batch,
                // What is joined so far goes out now; an end is seen again at the next poll.
                _ if !buf.is_empty() => break,
                Poll::Ready(None) => return this.end(),
                Poll::Pending => return Poll::Pending,
            };
            if batch.len() >= ZERO_COPY_MIN {
                response_head(&mut buf, this.id, batch.len());
                this.batch = Some(batch);
                break;
            }
            response_head(&mut buf, this.id, batch.len());
            buf.extend_from_slice(&batch);
            if buf.len() >= JOIN_BYTES {
                break;
            }
        }
        Poll::Ready(Some(Ok(Frame::data(buf.freeze()))))
    }
}

/// Reads the one request message of a server-streaming call, with tonic's limits and answers.
async fn read_request(
    headers: &http::HeaderMap,
    mut body: Body,
    max_message: usize,
) -> Result<pb::SubscribeRequest, Status> {
    if let Some(enc) = headers.get("grpc-encoding") {
        if enc.as_bytes() != b"identity" {
            return Err(Status::unimplemented(format!(
                "Content is compressed with `{}` which isn't supported",
                String::from_utf8_lossy(enc.as_bytes())
            )));
        }
    }
    let mut frames = Deframer::new(max_message);
    loop {
        if let Some(message) = frames.next_message()? {
            return pb::SubscribeRequest::decode(message).map_err(gma_proto::codec::not_a_message);
        }
        match body.frame().await {
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    frames.push(data);
                }
            }
            Some(Err(s)) => return Err(s),
            None if frames.mid_message() => return Err(Status::internal("Unexpected EOF decoding stream.")),
            None => return Err(Status::internal("Missing request message.")),
        }
    }
}

/// `Producer` with Subscribe served by this module and every other method by the generated
/// server (same name, so the router, health and reflection see one service).
#[derive(Clone)]
pub struct ProducerGrpc {
    service: ProducerService,
    generated: ProducerServer<ProducerService>,
    max_message: usize,
}

impl ProducerGrpc {
    /// `max_message`: the largest request message accepted (as the generated server's
    /// `max_decoding_message_size`).
    pub fn new(service: ProducerService, max_message: usize) -> ProducerGrpc {
        ProducerGrpc {
            generated: ProducerServer::new(service.clone()).max_decoding_message_size(max_message),
            service,
            max_message,
        }
    }
}

impl NamedService for ProducerGrpc {
    const NAME: &'static str = <ProducerServer<ProducerService> as NamedService>::NAME;
}

impl Service<http::Request<Body>> for ProducerGrpc {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<http::Response<Body>, Infallible>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        if req.uri().path() != SUBSCRIBE_PATH {
            return self.generated.call(req);
        }
        let (service, max) = (self.service.clone(), self.max_message);
        Box::pin(async move {
            let (parts, body) = req.into_parts();
            let opened = match read_request(&parts.headers, body, max).await {
                Ok(msg) => service
                    .open_subscription(tonic::Request::from_http(http::Request::from_parts(parts, msg))),
                Err(s) => Err(s),
            };
            Ok(match opened {
                Ok(o) => subscribe_response(o),
                Err(status) => status.into_http(),
            })
        })
    }
}

fn subscribe_response(o: Opened) -> http::Response<Body> {
    let body = SubscribeBody {
        id: o.id,
        rx: o.rx,
        cancel: o.cancel,
        _slot: o.slot,
        first: true,
        batch: None,
        ended: false,
    };
    let mut response = http::Response::new(Body::new(body));
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/grpc"),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use gma_proto::wire::SubscribeResponse;

    /// What tonic writes for one message: the 5-byte prefix, then prost's encoding.
    fn tonic_frame(id: u64, batch: &Bytes) -> Vec<u8> {
        let msg = SubscribeResponse {
            subscription_id: id,
            batch: batch.clone(),
        }
        .encode_to_vec();
        let mut out = vec![0u8];
        out.extend_from_slice(&(msg.len() as u32).to_be_bytes());
        out.extend_from_slice(&msg);
        out
    }

    #[test]
    fn heads_and_batches_are_the_bytes_tonic_writes() {
        for id in [0u64, 1, 127, 128, 300, u64::MAX] {
            for len in [0usize, 1, 127, 128, 16_383, 16_384, ZERO_COPY_MIN, 300_000] {
                let batch = Bytes::from((0..len).map(|i| i as u8).collect::<Vec<u8>>());
                let mut head = BytesMut::new();
                response_head(&mut head, id, batch.len());
                head.extend_from_slice(&batch);
                assert_eq!(
                    head.as_ref(),
                    tonic_frame(id, &batch).as_slice(),
                    "id {id}, len {len}"
                );
            }
        }
    }

    /// A slot of no connection (a request without a peer address).
    fn slot() -> gma_core::guard::Slot {
        let policy = gma_core::guard::load_policy(None).unwrap();
        let gate = gma_core::guard::Gate::new(policy, Default::default());
        gate.open_subscription(&tonic::Request::new(())).unwrap()
    }

    fn body(rx: mpsc::Receiver<Bytes>, cancel: Arc<Cancel>) -> SubscribeBody {
        SubscribeBody {
            id: 7,
            rx,
            cancel,
            _slot: slot(),
            first: true,
            batch: None,
            ended: false,
        }
    }

    /// Collects the body's data (until trailers) and its trailers' grpc-status.
    async fn collect(mut b: SubscribeBody) -> (Vec<Bytes>, Option<String>) {
        let mut data = Vec::new();
        while let Some(f) = std::future::poll_fn(|cx| http_body::Body::poll_frame(Pin::new(&mut b), cx)).await
        {
            match f.map(Frame::into_data) {
                Ok(Ok(d)) => data.push(d),
                Ok(Err(trailers)) => {
                    let status = trailers
                        .trailers_ref()
                        .and_then(|t| t.get(Status::GRPC_STATUS))
                        .and_then(|v| v.to_str().ok())
                        .map(str::to_string);
                    return (data, status);
                }
                Err(s) => panic!("body error {s}"),
            }
        }
        (data, None)
    }

    #[tokio::test]
    async fn a_stream_is_the_id_then_every_batch_then_ok() {
        let (tx, rx) = mpsc::channel(8);
        let small = Bytes::from(vec![1u8; 100]);
        let large = Bytes::from(vec![2u8; ZERO_COPY_MIN + 5]);
        for b in [&small, &small, &large, &small] {
            tx.send(b.clone()).await.unwrap();
        }
        drop(tx);
        let (frames, status) = collect(body(rx, Arc::new(Cancel::default()))).await;
        assert_eq!(status.as_deref(), Some("0"));
        // The large batch is its own frame, the very buffer it was sent in.
        assert!(frames
            .iter()
            .any(|f| f.len() == large.len() && f.as_ptr() == large.as_ptr()));
        let wire: Vec<u8> = frames.iter().flat_map(|f| f.iter().copied()).collect();
        let mut want = tonic_frame(7, &Bytes::new());
        for b in [&small, &small, &large, &small] {
            want.extend_from_slice(&tonic_frame(7, b));
        }
        assert_eq!(wire, want);
    }

    #[tokio::test]
    async fn a_cancelled_stream_ends_with_ok_and_sends_nothing_more() {
        let (tx, rx) = mpsc::channel(8);
        tx.send(Bytes::from_static(b"x")).await.unwrap();
        let cancel = Arc::new(Cancel::default());
        cancel.cancel();
        let (frames, status) = collect(body(rx, cancel)).await;
        assert!(frames.is_empty());
        assert_eq!(status.as_deref(), Some("0"));
    }

    fn grpc_request(bytes: Vec<u8>) -> Body {
        Body::new(http_body_util::Full::new(Bytes::from(bytes)))
    }

    #[tokio::test]
    async fn requests_are_read_with_tonics_limits_and_answers() {
        let req = pb::SubscribeRequest {
            patterns: vec!["host.*".into()],
            max_batch: 10,
            ..Default::default()
        };
        let msg = req.encode_to_vec();
        let mut framed = vec![0u8];
        framed.extend_from_slice(&(msg.len() as u32).to_be_bytes());
        framed.extend_from_slice(&msg);
        let h = http::HeaderMap::new();
        assert_eq!(
            read_request(&h, grpc_request(framed.clone()), 1 << 20)
                .await
                .unwrap(),
            req
        );
        // Too large for the limit.
        let e = read_request(&h, grpc_request(framed.clone()), 3)
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::OutOfRange, "{e}");
        // No message at all, or cut short.
        let e = read_request(&h, grpc_request(Vec::new()), 1 << 20)
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::Internal, "{e}");
        let e = read_request(&h, grpc_request(framed[..framed.len() - 1].to_vec()), 1 << 20)
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::Internal, "{e}");
        assert!(e.message().contains("Unexpected EOF"), "{e}");
        // Not a SubscribeRequest.
        let e = read_request(&h, grpc_request(vec![0, 0, 0, 0, 2, 0xff, 0xff]), 1 << 20)
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e}");
        // Compressed.
        let mut flagged = framed.clone();
        flagged[0] = 1;
        let e = read_request(&h, grpc_request(flagged), 1 << 20)
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::Internal, "{e}");
        let mut gz = http::HeaderMap::new();
        gz.insert("grpc-encoding", http::HeaderValue::from_static("gzip"));
        let e = read_request(&gz, grpc_request(framed), 1 << 20)
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::Unimplemented, "{e}");
    }
}
