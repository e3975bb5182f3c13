//! A gRPC response read message by message without copying its DATA frames.
//!
//! tonic's `Streaming` copies every received DATA frame into its own decode buffer before a
//! message is decoded (a `memmove` of every byte a subscription receives). HTTP/2 (h2, through
//! hyper and tonic's `Channel`) already hands each DATA frame's payload over as a `Bytes` slice
//! of its read buffer, so a message that lies inside one frame can be sliced out of it
//! ([`Bytes::slice`], a reference count, no copy), and a message that spans frames is kept as
//! the slices of each ([`Message`], a `Buf` prost decodes from), bounded by the message size
//! limit.
//!
//! - [`Deframer`]: the framing alone (no I/O): DATA payloads in, whole messages out. Each
//!   message is prefixed by 5 bytes: a compressed flag (0: we never ask for compression) and
//!   its length as a big-endian u32.
//! - [`GrpcResponse`]: a response's head checked (HTTP status, `content-type`, a
//!   trailers-only refusal) and its body read frame by frame into the [`Deframer`], ending
//!   with the `grpc-status` of its trailers. Every failure is the [`Status`] tonic's client
//!   gives for it, so callers handle refusals, reconnects and errors as before.
//! - [`request`]: a unary or server-streaming request as tonic's client sends it, its body one
//!   message behind its 5-byte prefix ([`frame_message`]).

use std::collections::VecDeque;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http_body_util::BodyExt;
use tonic::codegen::http::{
    header, HeaderMap, HeaderValue, Method, Request, Response, StatusCode, Uri, Version,
};
use tonic::codegen::Body;
use tonic::{Code, Status};

/// A message's prefix: the compressed flag and the length (big-endian u32).
const PREFIX: usize = 5;

/// Splits the DATA frames of a gRPC body into its messages.
///
/// A message that lies inside one frame comes back as one slice of it; one that spans frames
/// as the slices of each (no copy either way). The producer sends a large batch as two frames
/// — the prefix and the response's small fields, then the batch's own buffer
/// (`gma_producer::send`) — so the second case is the common one for large batches, and the
/// batch field, wholly inside the second frame, is decoded as a slice of it
/// ([`Message::copy_to_bytes`]).
#[derive(Debug)]
pub struct Deframer {
    /// Frames (or what is left of them) not yet split into messages, in order; none empty.
    frames: VecDeque<Bytes>,
    /// Bytes held in `frames`.
    held: usize,
    /// The length of the message whose prefix has been read, until the message is whole.
    want: Option<usize>,
    /// The largest message accepted (bytes, prefix not counted).
    limit: usize,
}

impl Deframer {
    pub fn new(limit: usize) -> Deframer {
        Deframer {
            frames: VecDeque::new(),
            held: 0,
            want: None,
            limit,
        }
    }

    /// Hands over the next DATA frame's payload. What is held stays bounded: a message's
    /// length is checked against the limit as soon as its prefix is in, and whole messages
    /// are taken out by [`Deframer::next_message`] before the next frame is read.
    pub fn push(&mut self, data: Bytes) {
        if !data.is_empty() {
            self.held += data.len();
            self.frames.push_back(data);
        }
    }

    /// Whether bytes of an unfinished message are held (the body must go on).
    pub fn mid_message(&self) -> bool {
        self.held > 0 || self.want.is_some()
    }

    /// The next whole message, or `None` when the frames pushed so far hold no other.
    pub fn next_message(&mut self) -> Result<Option<Message>, Status> {
        let len = match self.want {
            Some(len) => len,
            None => {
                if self.held < PREFIX {
                    return Ok(None);
                }
                let mut prefix = [0u8; PREFIX];
                self.take(PREFIX).copy_to_slice(&mut prefix);
                let len = self.message_len(&prefix)?;
                self.want = Some(len);
                len
            }
        };
        if self.held < len {
            return Ok(None);
        }
        self.want = None;
        Ok(Some(self.take(len)))
    }

    /// The first `n` bytes held (at most `held`), as slices of their frames.
    fn take(&mut self, n: usize) -> Message {
        let mut parts = VecDeque::new();
        let mut need = n.min(self.held);
        self.held -= need;
        while need > 0 {
            let Some(front) = self.frames.front_mut() else {
                break;
            };
            if front.len() <= need {
                need -= front.len();
                parts.extend(self.frames.pop_front());
            } else {
                parts.push_back(front.split_to(need));
                need = 0;
            }
        }
        Message {
            remaining: n - need,
            parts,
        }
    }

    /// The length a prefix announces, checked against the flag and the limit. The answers are
    /// tonic's own (the producer reads its requests with this too, `gma_producer::send`).
    fn message_len(&self, mut prefix: &[u8]) -> Result<usize, Status> {
        let flag = prefix.get_u8();
        let len = prefix.get_u32() as usize;
        match flag {
            0 => {}
            1 => {
                return Err(Status::internal(
                    "protocol error: received message with compressed-flag but no grpc-encoding was specified",
                ))
            }
            f => {
                return Err(Status::internal(format!(
                    "protocol error: received message with invalid compression flag: {f} (valid flags are 0 and 1)"
                )))
            }
        }
        if len > self.limit {
            return Err(Status::out_of_range(format!(
                "Error, decoded message length too large: found {len} bytes, the limit is: {} bytes",
                self.limit
            )));
        }
        Ok(len)
    }
}

/// One message's bytes: the slices of the frames it came in (one, unless it spanned frames).
/// A `Buf`, so prost decodes straight from it; [`Message::copy_to_bytes`] hands out a slice
/// of a frame, not a copy, whenever the bytes asked for lie inside one.
#[derive(Debug, Default)]
pub struct Message {
    /// None empty.
    parts: VecDeque<Bytes>,
    remaining: usize,
}

impl Message {
    /// The message as one buffer: its one slice, or a copy joining its slices.
    pub fn into_bytes(mut self) -> Bytes {
        match self.parts.len() {
            0 => Bytes::new(),
            1 => self.parts.pop_front().unwrap_or_default(),
            _ => {
                let mut all = BytesMut::with_capacity(self.remaining);
                for p in &self.parts {
                    all.extend_from_slice(p);
                }
                all.freeze()
            }
        }
    }

    /// How many frames the message spans (1 when it lay inside one; 0 when empty).
    pub fn frames(&self) -> usize {
        self.parts.len()
    }
}

impl Buf for Message {
    fn remaining(&self) -> usize {
        self.remaining
    }

    fn chunk(&self) -> &[u8] {
        self.parts.front().map_or(&[], |b| b.as_ref())
    }

    fn advance(&mut self, mut cnt: usize) {
        cnt = cnt.min(self.remaining);
        self.remaining -= cnt;
        while cnt > 0 {
            let Some(front) = self.parts.front_mut() else {
                return;
            };
            if cnt < front.len() {
                front.advance(cnt);
                return;
            }
            cnt -= front.len();
            self.parts.pop_front();
        }
    }

    fn copy_to_bytes(&mut self, len: usize) -> Bytes {
        match self.parts.front_mut() {
            Some(front) if front.len() >= len => {
                let out = front.split_to(len);
                if front.is_empty() {
                    self.parts.pop_front();
                }
                self.remaining -= len;
                out
            }
            // Across slices: joined (a copy), as `Buf`'s default does.
            _ => {
                let mut out = BytesMut::with_capacity(len);
                out.put((&mut *self).take(len));
                out.freeze()
            }
        }
    }
}

/// A gRPC response read message by message ([`GrpcResponse::message`]), its messages sliced
/// from the DATA frames ([`Deframer`]).
pub struct GrpcResponse<B> {
    body: B,
    deframer: Deframer,
    /// The body ended (trailers, an error, or a trailers-only response): nothing more to read.
    done: bool,
}

impl<B> GrpcResponse<B>
where
    B: Body<Data = Bytes, Error = Status> + Unpin,
{
    /// Checks a response's head as tonic's client does: a `grpc-status` in the headers is a
    /// trailers-only response (an error status is returned, OK is an empty stream); another
    /// HTTP status than 200 maps to its gRPC code; a `content-type` other than
    /// `application/grpc[+...]` is not a gRPC response.
    pub fn new(response: Response<B>, limit: usize) -> Result<GrpcResponse<B>, Status> {
        let (head, body) = response.into_parts();
        let mut done = false;
        if let Some(status) = Status::from_header_map(&head.headers) {
            if status.code() != Code::Ok {
                return Err(status);
            }
            done = true;
        } else if head.status != StatusCode::OK {
            return Err(status_of_http(head.status));
        } else if !is_grpc(&head.headers) {
            let found = head.headers.get(header::CONTENT_TYPE);
            return Err(Status::unknown(format!(
                "the response's content-type is {found:?}, not application/grpc: is this address a \
                 gRPC service of the fabric?"
            )));
        }
        Ok(GrpcResponse {
            body,
            deframer: Deframer::new(limit),
            done,
        })
    }

    /// The next message; `Ok(None)` once the stream ended with an OK status. The stream's end
    /// with an error status in its trailers, a broken body, or a body that ends without
    /// trailers or inside a message is an error, once; after it, `Ok(None)`.
    pub async fn message(&mut self) -> Result<Option<Message>, Status> {
        loop {
            if self.done {
                return Ok(None);
            }
            if let Some(message) = self.deframer.next_message().inspect_err(|_| self.done = true)? {
                return Ok(Some(message));
            }
            let frame = match self.body.frame().await {
                Some(Ok(frame)) => frame,
                Some(Err(status)) => {
                    self.done = true;
                    return Err(status);
                }
                None => {
                    self.done = true;
                    return Err(if self.deframer.mid_message() {
                        Status::internal("the stream ended inside a message")
                    } else {
                        Status::unknown(
                            "protocol error: missing grpc-status trailer, the stream ended without a \
                             final status (cut by a proxy or load balancer?)",
                        )
                    });
                }
            };
            match frame.into_data() {
                Ok(data) => self.deframer.push(data),
                Err(frame) => {
                    // Not data: the trailers, the stream's last frame.
                    let Ok(trailers) = frame.into_trailers() else {
                        continue;
                    };
                    self.done = true;
                    return match Status::from_header_map(&trailers) {
                        Some(status) if status.code() != Code::Ok => Err(status),
                        Some(_) if self.deframer.mid_message() => {
                            Err(Status::internal("the stream ended inside a message"))
                        }
                        Some(_) => Ok(None),
                        None => Err(Status::unknown(
                            "protocol error: the stream's trailers carry no grpc-status",
                        )),
                    };
                }
            }
        }
    }
}

/// `content-type: application/grpc`, or `application/grpc+<format>`.
fn is_grpc(headers: &HeaderMap) -> bool {
    headers.get(header::CONTENT_TYPE).is_some_and(|v| {
        let v = v.as_bytes();
        v == b"application/grpc" || v.starts_with(b"application/grpc+") || v.starts_with(b"application/grpc;")
    })
}

/// The gRPC code of an HTTP status without a `grpc-status`, as tonic's client maps it (gRPC's
/// http-grpc-status-mapping.md).
fn status_of_http(http: StatusCode) -> Status {
    let code = match http {
        StatusCode::BAD_REQUEST => Code::Internal,
        StatusCode::UNAUTHORIZED => Code::Unauthenticated,
        StatusCode::FORBIDDEN => Code::PermissionDenied,
        StatusCode::NOT_FOUND => Code::Unimplemented,
        StatusCode::TOO_MANY_REQUESTS
        | StatusCode::BAD_GATEWAY
        | StatusCode::SERVICE_UNAVAILABLE
        | StatusCode::GATEWAY_TIMEOUT => Code::Unavailable,
        _ => Code::Unknown,
    };
    Status::new(
        code,
        format!(
            "grpc-status header missing, mapped from HTTP status code {}",
            http.as_u16()
        ),
    )
}

/// The request of a unary or server-streaming method as tonic's client sends it (a unit test
/// compares the two): POST over HTTP/2 to `path` (`/package.Service/Method`), `te: trailers`,
/// `content-type: application/grpc`, `message` as the whole body ([`frame_message`]); the
/// channel adds the scheme, authority and user agent.
pub fn request(
    path: &'static str,
    message: &impl prost::Message,
) -> Result<Request<tonic::body::Body>, Status> {
    let body = http_body_util::Full::new(frame_message(message)?);
    let mut request = Request::new(tonic::body::Body::new(body));
    *request.method_mut() = Method::POST;
    *request.uri_mut() = Uri::from_static(path);
    *request.version_mut() = Version::HTTP_2;
    let headers = request.headers_mut();
    headers.insert(header::TE, HeaderValue::from_static("trailers"));
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    // What tonic's generated client attaches for interceptors and layers.
    if let Some((service, method)) = path.trim_start_matches('/').split_once('/') {
        request
            .extensions_mut()
            .insert(tonic::GrpcMethod::new(service, method));
    }
    Ok(request)
}

/// `message` encoded behind its 5-byte prefix (uncompressed): a unary or server-streaming
/// request's whole body.
pub fn frame_message(message: &impl prost::Message) -> Result<Bytes, Status> {
    let len = message.encoded_len();
    let prefix_len = u32::try_from(len)
        .map_err(|_| Status::invalid_argument(format!("a request of {len} bytes is too large to send")))?;
    let mut buf = BytesMut::with_capacity(PREFIX + len);
    buf.put_u8(0);
    buf.put_u32(prefix_len);
    message
        .encode(&mut buf)
        .map_err(|e| Status::internal(format!("encoding the request: {e}")))?;
    Ok(buf.freeze())
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body::Frame;
    use http_body_util::StreamBody;
    use proptest::prelude::*;

    const LIMIT: usize = 1 << 20;

    /// `payload` behind its prefix.
    fn framed(payload: &[u8]) -> Vec<u8> {
        let mut v = vec![0];
        v.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        v.extend_from_slice(payload);
        v
    }

    /// Pushes `frames` in turn, draining after each; the messages in order.
    fn deframe(frames: &[Bytes]) -> Result<Vec<Bytes>, Status> {
        let mut d = Deframer::new(LIMIT);
        let mut out = Vec::new();
        for f in frames {
            d.push(f.clone());
            while let Some(m) = d.next_message()? {
                out.push(m.into_bytes());
            }
        }
        assert!(!d.mid_message(), "bytes left over");
        Ok(out)
    }

    /// Whether `inner` lies inside `outer`'s memory (a slice, not a copy).
    fn inside(inner: &Bytes, outer: &Bytes) -> bool {
        let (o, i) = (outer.as_ptr() as usize, inner.as_ptr() as usize);
        i >= o && i + inner.len() <= o + outer.len()
    }

    #[test]
    fn two_messages_in_one_frame_are_slices_of_it() -> Result<(), Status> {
        let mut bytes = framed(b"hello");
        bytes.extend(framed(b"world!"));
        let frame = Bytes::from(bytes);
        let got = deframe(std::slice::from_ref(&frame))?;
        assert_eq!(
            got,
            vec![Bytes::from_static(b"hello"), Bytes::from_static(b"world!")]
        );
        assert!(got.iter().all(|m| inside(m, &frame)));
        Ok(())
    }

    #[test]
    fn a_message_split_at_every_position_comes_back_whole() -> Result<(), Status> {
        let mut bytes = framed(b"0123456789");
        bytes.extend(framed(b""));
        bytes.extend(framed(b"abc"));
        for cut in 0..=bytes.len() {
            let frames = [
                Bytes::copy_from_slice(&bytes[..cut]),
                Bytes::copy_from_slice(&bytes[cut..]),
            ];
            let got = deframe(&frames)?;
            assert_eq!(
                got,
                vec![
                    Bytes::from_static(b"0123456789"),
                    Bytes::new(),
                    Bytes::from_static(b"abc")
                ],
                "cut at {cut}"
            );
        }
        Ok(())
    }

    #[test]
    fn frames_pushed_without_draining_lose_nothing() -> Result<(), Status> {
        let mut bytes = framed(b"one");
        bytes.extend(framed(b"two"));
        let mut d = Deframer::new(LIMIT);
        d.push(Bytes::from(bytes));
        d.push(Bytes::from(framed(b"three")));
        let mut got = Vec::new();
        while let Some(m) = d.next_message()? {
            got.push(m.into_bytes());
        }
        assert_eq!(
            got,
            ["one", "two", "three"].map(|s| Bytes::from_static(s.as_bytes()))
        );
        assert!(!d.mid_message());
        Ok(())
    }

    #[test]
    fn a_message_over_the_limit_is_refused_before_it_is_gathered() {
        let mut d = Deframer::new(4);
        d.push(Bytes::from(framed(b"12345")));
        let err = d.next_message().err();
        assert_eq!(err.map(|s| s.code()), Some(Code::OutOfRange));
        // At the limit: accepted.
        let mut d = Deframer::new(5);
        d.push(Bytes::from(framed(b"12345")));
        assert_eq!(
            d.next_message().ok().flatten().map(Message::into_bytes),
            Some(Bytes::from_static(b"12345"))
        );
        // Announced in a prefix split across frames: refused as soon as the prefix is whole.
        let mut d = Deframer::new(4);
        let bytes = framed(b"12345");
        d.push(Bytes::copy_from_slice(&bytes[..3]));
        assert!(matches!(d.next_message(), Ok(None)));
        d.push(Bytes::copy_from_slice(&bytes[3..]));
        assert_eq!(d.next_message().err().map(|s| s.code()), Some(Code::OutOfRange));
    }

    #[test]
    fn a_compressed_or_unknown_flag_is_a_protocol_error() {
        for flag in [1u8, 2, 255] {
            let mut bytes = framed(b"x");
            bytes[0] = flag;
            let mut d = Deframer::new(LIMIT);
            d.push(Bytes::from(bytes));
            let err = d.next_message().err();
            assert_eq!(
                err.as_ref().map(|s| s.code()),
                Some(Code::Internal),
                "flag {flag}"
            );
            assert!(err.is_some_and(|s| s.message().contains("protocol error")));
        }
    }

    /// Records the requests tonic's client sends through it and answers each with an empty
    /// trailers-only OK.
    #[derive(Clone, Default)]
    struct Recorder(std::sync::Arc<parking_lot::Mutex<Vec<Request<tonic::body::Body>>>>);

    impl tonic::codegen::Service<Request<tonic::body::Body>> for Recorder {
        type Response = Response<tonic::body::Body>;
        type Error = std::convert::Infallible;
        type Future = std::future::Ready<Result<Self::Response, Self::Error>>;

        fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), Self::Error>> {
            std::task::Poll::Ready(Ok(()))
        }

        fn call(&mut self, req: Request<tonic::body::Body>) -> Self::Future {
            self.0.lock().push(req);
            let mut r = Response::new(tonic::body::Body::empty());
            r.headers_mut()
                .insert("grpc-status", HeaderValue::from_static("0"));
            std::future::ready(Ok(r))
        }
    }

    #[tokio::test]
    async fn the_request_is_the_one_tonics_client_sends() -> Result<(), Box<dyn std::error::Error>> {
        use gma_proto::v1::SubscribeRequest;
        let req = SubscribeRequest {
            patterns: vec!["cpu.*".into()],
            max_batch: 10_000,
            ..Default::default()
        };
        let path = "/gma.v1.Producer/Subscribe";
        let recorder = Recorder::default();
        let mut client = tonic::client::Grpc::new(recorder.clone());
        client.ready().await?;
        let codec =
            gma_proto::codec::ProstCodec::<SubscribeRequest, gma_proto::wire::SubscribeResponse>::default();
        let mut theirs = tonic::Request::new(req.clone());
        theirs
            .extensions_mut()
            .insert(tonic::GrpcMethod::new("gma.v1.Producer", "Subscribe"));
        client
            .server_streaming(
                theirs,
                tonic::codegen::http::uri::PathAndQuery::from_static(path),
                codec,
            )
            .await?;
        let Some(theirs) = recorder.0.lock().pop() else {
            panic!("tonic sent nothing");
        };
        let ours = request(path, &req)?;
        assert_eq!(ours.method(), theirs.method());
        assert_eq!(ours.uri(), theirs.uri());
        assert_eq!(ours.version(), theirs.version());
        assert_eq!(ours.headers(), theirs.headers());
        assert_eq!(
            ours.extensions()
                .get::<tonic::GrpcMethod>()
                .map(|m| (m.service(), m.method())),
            theirs
                .extensions()
                .get::<tonic::GrpcMethod>()
                .map(|m| (m.service(), m.method()))
        );
        let ours = ours.into_body().collect().await?.to_bytes();
        let theirs = theirs.into_body().collect().await?.to_bytes();
        assert_eq!(ours, theirs);
        Ok(())
    }

    #[test]
    fn a_request_is_one_framed_message() -> Result<(), Status> {
        let req = gma_proto::v1::SubscribeRequest {
            patterns: vec!["cpu.*".into()],
            ..Default::default()
        };
        let body = frame_message(&req)?;
        let got = deframe(&[body])?;
        assert_eq!(got.len(), 1);
        let back = <gma_proto::v1::SubscribeRequest as prost::Message>::decode(got[0].clone())
            .map_err(|e| Status::internal(e.to_string()))?;
        assert_eq!(back, req);
        Ok(())
    }

    #[test]
    fn a_decoded_batch_is_a_slice_of_the_frame() -> Result<(), prost::DecodeError> {
        use prost::Message;
        let msg = gma_proto::wire::SubscribeResponse {
            subscription_id: 7,
            batch: Bytes::from(vec![9u8; 300]),
        };
        let frame = Bytes::from(framed(&msg.encode_to_vec()));
        let mut d = Deframer::new(LIMIT);
        d.push(frame.clone());
        let Ok(Some(message)) = d.next_message() else {
            panic!("no message");
        };
        let got = gma_proto::wire::SubscribeResponse::decode(message)?;
        assert_eq!(got, msg);
        // prost keeps a `bytes = "bytes"` field as a slice of what it decodes from.
        assert!(inside(&got.batch, &frame));
        Ok(())
    }

    #[test]
    fn a_batch_sent_after_its_head_frame_is_decoded_as_a_slice_of_its_own_frame(
    ) -> Result<(), prost::DecodeError> {
        use prost::Message as _;
        // The producer's layout for a large batch: the prefix and the response's fields up to
        // the batch's length in one frame, the batch's own buffer in the next.
        let msg = gma_proto::wire::SubscribeResponse {
            subscription_id: 300,
            batch: Bytes::from(vec![7u8; 40_000]),
        };
        let whole = framed(&msg.encode_to_vec());
        let head_len = whole.len() - msg.batch.len();
        let (head, batch) = (
            Bytes::copy_from_slice(&whole[..head_len]),
            Bytes::copy_from_slice(&whole[head_len..]),
        );
        let mut d = Deframer::new(LIMIT);
        d.push(head);
        assert!(matches!(d.next_message(), Ok(None)));
        d.push(batch.clone());
        let Ok(Some(message)) = d.next_message() else {
            panic!("no message");
        };
        assert_eq!(message.frames(), 2);
        let got = gma_proto::wire::SubscribeResponse::decode(message)?;
        assert_eq!(got, msg);
        assert!(inside(&got.batch, &batch), "the batch was copied");
        assert!(!d.mid_message());
        Ok(())
    }

    type TestBody = StreamBody<futures::stream::Iter<std::vec::IntoIter<Result<Frame<Bytes>, Status>>>>;

    fn response(
        status: u16,
        headers: &[(&'static str, &'static str)],
        frames: Vec<Frame<Bytes>>,
    ) -> Response<TestBody> {
        let body = StreamBody::new(futures::stream::iter(
            frames.into_iter().map(Ok).collect::<Vec<_>>(),
        ));
        let mut r = Response::new(body);
        *r.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        for (k, v) in headers {
            r.headers_mut().insert(*k, header::HeaderValue::from_static(v));
        }
        r
    }

    fn trailers(code: &'static str, message: &'static str) -> Frame<Bytes> {
        let mut t = HeaderMap::new();
        t.insert("grpc-status", header::HeaderValue::from_static(code));
        if !message.is_empty() {
            t.insert("grpc-message", header::HeaderValue::from_static(message));
        }
        Frame::trailers(t)
    }

    const GRPC: &[(&str, &str)] = &[("content-type", "application/grpc")];

    /// Reads every message, then the end.
    async fn read_all(r: Response<TestBody>) -> (Vec<Bytes>, Result<(), Status>) {
        let mut got = Vec::new();
        let mut s = match GrpcResponse::new(r, LIMIT) {
            Ok(s) => s,
            Err(e) => return (got, Err(e)),
        };
        loop {
            match s.message().await {
                Ok(Some(m)) => got.push(m.into_bytes()),
                Ok(None) => return (got, Ok(())),
                Err(e) => {
                    // Once, then the end.
                    assert!(matches!(s.message().await, Ok(None)));
                    return (got, Err(e));
                }
            }
        }
    }

    #[tokio::test]
    async fn trailers_end_the_stream_with_their_status() {
        let data = Frame::data(Bytes::from(framed(b"one")));
        let (got, end) = read_all(response(200, GRPC, vec![data, trailers("0", "")])).await;
        assert_eq!(got, vec![Bytes::from_static(b"one")]);
        assert!(end.is_ok());

        let data = Frame::data(Bytes::from(framed(b"one")));
        let (got, end) = read_all(response(200, GRPC, vec![data, trailers("14", "going%20away")])).await;
        assert_eq!(got.len(), 1);
        let end = end.err();
        assert_eq!(end.as_ref().map(|s| s.code()), Some(Code::Unavailable));
        assert_eq!(end.as_ref().map(|s| s.message()), Some("going away"));
    }

    #[tokio::test]
    async fn a_refusal_in_the_headers_is_the_status_itself() {
        let refused = [
            ("content-type", "application/grpc"),
            ("grpc-status", "7"),
            ("grpc-message", "not%20allowed"),
        ];
        let (_, end) = read_all(response(200, &refused, vec![])).await;
        let end = end.err();
        assert_eq!(end.as_ref().map(|s| s.code()), Some(Code::PermissionDenied));
        assert_eq!(end.as_ref().map(|s| s.message()), Some("not allowed"));
        // Trailers-only with OK: an empty stream.
        let ok = [("content-type", "application/grpc"), ("grpc-status", "0")];
        let (got, end) = read_all(response(200, &ok, vec![])).await;
        assert!(got.is_empty() && end.is_ok());
    }

    #[tokio::test]
    async fn a_head_that_is_not_grpc_maps_as_tonic_maps_it() {
        let code = |r| async move { read_all(r).await.1.err().map(|s| s.code()) };
        assert_eq!(
            code(response(403, &[], vec![])).await,
            Some(Code::PermissionDenied)
        );
        assert_eq!(code(response(503, GRPC, vec![])).await, Some(Code::Unavailable));
        assert_eq!(code(response(404, &[], vec![])).await, Some(Code::Unimplemented));
        assert_eq!(code(response(500, &[], vec![])).await, Some(Code::Unknown));
        assert_eq!(code(response(200, &[], vec![])).await, Some(Code::Unknown));
        let html = [("content-type", "text/html")];
        assert_eq!(code(response(200, &html, vec![])).await, Some(Code::Unknown));
        let proto = [("content-type", "application/grpc+proto")];
        assert_eq!(code(response(200, &proto, vec![trailers("0", "")])).await, None);
    }

    #[tokio::test]
    async fn a_body_that_ends_without_trailers_or_inside_a_message_is_an_error() {
        let data = Frame::data(Bytes::from(framed(b"one")));
        let (got, end) = read_all(response(200, GRPC, vec![data])).await;
        assert_eq!(got.len(), 1);
        assert_eq!(end.err().map(|s| s.code()), Some(Code::Unknown));

        let bytes = framed(b"cut short");
        let cut = || Frame::data(Bytes::copy_from_slice(&bytes[..7]));
        let (got, end) = read_all(response(200, GRPC, vec![cut()])).await;
        assert!(got.is_empty());
        assert_eq!(end.err().map(|s| s.code()), Some(Code::Internal));
        let (_, end) = read_all(response(200, GRPC, vec![cut(), trailers("0", "")])).await;
        assert_eq!(end.err().map(|s| s.code()), Some(Code::Internal));
    }

    proptest! {
        /// Any split of any messages into frames gives back the messages; those inside one
        /// frame are slices of it.
        #[test]
        fn any_split_gives_back_the_messages(
            sizes in proptest::collection::vec(0usize..600, 0..12),
            cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..20),
        ) {
            let messages: Vec<Vec<u8>> = sizes
                .iter()
                .enumerate()
                .map(|(i, n)| (0..*n).map(|j| (i * 31 + j) as u8).collect())
                .collect();
            let stream: Vec<u8> = messages.iter().flat_map(|m| framed(m)).collect();
            let mut at: Vec<usize> = cuts.iter().map(|c| c.index(stream.len() + 1)).collect();
            at.push(0);
            at.push(stream.len());
            at.sort_unstable();
            at.dedup();
            let frames: Vec<Bytes> = at.windows(2).map(|w| Bytes::copy_from_slice(&stream[w[0]..w[1]])).collect();

            let mut d = Deframer::new(LIMIT);
            let mut got = Vec::new();
            for (i, f) in frames.iter().enumerate() {
                d.push(f.clone());
                while let Some(m) = d.next_message().map_err(|e| TestCaseError::fail(e.to_string()))? {
                    // Never a copy: every slice of the message is one of a frame pushed so far.
                    for part in &m.parts {
                        prop_assert!(frames[..=i].iter().any(|f| inside(part, f)));
                    }
                    got.push(m.into_bytes());
                }
            }
            prop_assert!(!d.mid_message());
            let want: Vec<Bytes> = messages.into_iter().map(Bytes::from).collect();
            prop_assert_eq!(got, want);
        }
    }
}
