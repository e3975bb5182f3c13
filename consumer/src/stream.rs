//! One subscription to one producer, kept alive across disconnects.
//!
//! [`ProducerStream`] subscribes, decodes batches (calling back per event without copying), and
//! remembers the epoch and the next seq it needs. When the stream breaks (producer restarted,
//! network error, producer closed it) it reconnects with exponential backoff and resubscribes
//! with `resume_from_seq`, so nothing inside the producer's buffer window is lost; whatever the
//! producer could not replay comes back as explicit gaps.

use std::time::Duration;

use gma_core::codec::{BatchDecoder, EventRef};
use gma_proto::v1 as pb;
use gma_proto::wire::SubscribeResponse;
use prost::Message as _;
use tonic::codegen::Service;

use crate::counted::SocketBytes;
use crate::grpc_frames::{request, GrpcResponse, Message};
use crate::{connect_with, error_chain, ConsumerError};

/// The largest HTTP/2 frame this side accepts on a subscription's connection (what the
/// producer may send in one DATA frame; the protocol allows up to 16 MiB - 1).
pub const STREAM_MAX_FRAME_BYTES: u32 = 1 << 20;

/// Where to resume a stream: the producer run (epoch) and the first seq not yet received.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ResumePoint {
    pub epoch: u64,
    pub next_seq: u64,
}

#[derive(Debug, Clone)]
pub struct StreamOptions {
    pub patterns: Vec<String>,
    pub sources: Vec<String>,
    pub consumer_id: String,
    /// Events per batch asked of the producer (0 = producer default).
    pub max_batch: u32,
    /// Rate limit: at most one event per series per interval (0 = none).
    pub min_interval_ms: u64,
    /// What the producer does when this consumer falls behind (unspecified: its default).
    pub policy: pb::SlowPolicy,
    /// How far behind (producer events) before the policy acts (0 = producer default).
    pub queue_events: u32,
    /// Threshold crossing: only events where this expression changes value, marked enter/leave.
    pub when: String,
    /// Change filter: only events with a numeric field moved by more than this percent (0 = off).
    pub delta_pct: f64,
    /// Rolling summaries ("1m", "10m", "60m") instead of raw events.
    pub summaries: Vec<String>,
    /// Forecasts instead of raw events.
    pub forecast: bool,
    /// Reconnect after errors instead of returning them.
    pub reconnect: bool,
    pub initial_backoff: Duration,
    pub max_backoff: Duration,
}

impl Default for StreamOptions {
    fn default() -> Self {
        StreamOptions {
            patterns: vec!["*".into()],
            sources: Vec::new(),
            consumer_id: String::new(),
            max_batch: 0,
            min_interval_ms: 0,
            policy: pb::SlowPolicy::Unspecified,
            queue_events: 0,
            when: String::new(),
            delta_pct: 0.0,
            summaries: Vec::new(),
            forecast: false,
            reconnect: true,
            initial_backoff: Duration::from_millis(50),
            max_backoff: Duration::from_secs(2),
        }
    }
}

/// What one call to [`ProducerStream::next_with`] produced.
#[derive(Debug, Clone, PartialEq)]
pub enum Progress {
    /// A batch: how many events were passed to the callback, any gaps it reported, and how
    /// many events the producer conflated away (latest policy).
    Batch {
        events: usize,
        gaps: Vec<pb::Gap>,
        conflated: u64,
    },
    /// The stream broke; the next call reconnects (after a backoff).
    Reconnecting { error: String, attempt: u32 },
    /// A (re)subscription was accepted.
    Subscribed { subscription_id: u64 },
}

pub struct ProducerStream {
    address: String,
    opts: StreamOptions,
    /// The subscription's response, read message by message as slices of the received HTTP/2
    /// DATA frames ([`crate::grpc_frames`]); each message is decoded as
    /// `gma.v1.SubscribeResponse`'s twin with the batch left as its bytes (same bytes on the
    /// wire), then read from that slice into `batch` ([`gma_core::codec::read_batch`]: the
    /// packed columns straight from it).
    inbound: Option<GrpcResponse<tonic::body::Body>>,
    decoder: BatchDecoder,
    /// The batch being read, its columns' memory kept from one batch to the next.
    batch: pb::EventBatch,
    resume: Option<ResumePoint>,
    subscription_id: u64,
    attempt: u32,
    ended: bool,
    /// Where this stream's connections count their socket bytes, if anywhere.
    socket_bytes: Option<SocketBytes>,
}

impl ProducerStream {
    pub fn new(address: &str, opts: StreamOptions) -> ProducerStream {
        ProducerStream {
            address: address.to_string(),
            opts,
            inbound: None,
            decoder: BatchDecoder::new(),
            batch: pb::EventBatch::default(),
            resume: None,
            subscription_id: 0,
            attempt: 0,
            ended: false,
            socket_bytes: None,
        }
    }

    /// Counts every byte this stream's connections read and write on their sockets (gRPC,
    /// HTTP/2 and TLS included) into `bytes`, which other streams may share
    /// ([`crate::counted`]).
    pub fn with_socket_bytes(mut self, bytes: SocketBytes) -> ProducerStream {
        self.socket_bytes = Some(bytes);
        self
    }

    /// Starts from a known point (e.g. one saved before a consumer restart).
    pub fn with_resume(mut self, resume: Option<ResumePoint>) -> ProducerStream {
        self.resume = resume;
        self
    }

    pub fn address(&self) -> &str {
        &self.address
    }

    /// The epoch and next seq this stream would resume from.
    pub fn resume_point(&self) -> Option<ResumePoint> {
        self.resume
    }

    pub fn subscription_id(&self) -> u64 {
        self.subscription_id
    }

    async fn open(&mut self) -> Result<u64, ConsumerError> {
        // Frames as large as a batch: at HTTP/2's default of 16 KiB every batch of 1,000
        // events (27 KB) crossed in two or more frames, each a header and a pass of the
        // producer's and this side's framing.
        let mut channel = connect_with(
            &self.address,
            |ep| ep.max_frame_size(STREAM_MAX_FRAME_BYTES),
            self.socket_bytes.clone(),
        )
        .await?;
        let resume = self.resume.unwrap_or_default();
        let req = pb::SubscribeRequest {
            patterns: self.opts.patterns.clone(),
            sources: self.opts.sources.clone(),
            resume_from_seq: resume.next_seq,
            epoch: resume.epoch,
            consumer_id: self.opts.consumer_id.clone(),
            max_batch: self.opts.max_batch,
            min_interval_ms: self.opts.min_interval_ms,
            policy: self.opts.policy as i32,
            queue_events: self.opts.queue_events,
            when: self.opts.when.clone(),
            delta_pct: self.opts.delta_pct,
            summaries: self.opts.summaries.clone(),
            forecast: self.opts.forecast,
        };
        let rpc = |s| ConsumerError::Rpc(format!("subscribe to {}", self.address), s);
        std::future::poll_fn(|cx| channel.poll_ready(cx))
            .await
            .map_err(|e| {
                rpc(tonic::Status::unavailable(format!(
                    "connection not ready: {}",
                    error_chain(&e)
                )))
            })?;
        // `Producer.Subscribe` as tonic's generated client sends it, its response then read
        // without tonic's `Streaming`, which copies every DATA frame into its own buffer.
        let request = request("/gma.v1.Producer/Subscribe", &req).map_err(rpc)?;
        let response = channel
            .call(request)
            .await
            .map_err(|e| rpc(tonic::Status::from_error(Box::new(e))))?;
        let mut inbound = GrpcResponse::new(response, gma_core::MAX_MESSAGE_BYTES).map_err(rpc)?;
        // The first message carries the subscription id.
        let first = inbound
            .message()
            .await
            .and_then(|m| m.map(decode).transpose())
            .map_err(|s| ConsumerError::Rpc(format!("subscribe to {}", self.address), s))?
            .ok_or_else(|| {
                ConsumerError::Protocol(self.address.clone(), "stream ended before it began".into())
            })?;
        self.decoder = BatchDecoder::new();
        self.inbound = Some(inbound);
        self.subscription_id = first.subscription_id;
        Ok(first.subscription_id)
    }

    fn broke(&mut self, err: ConsumerError) -> Result<Option<Progress>, ConsumerError> {
        self.inbound = None;
        // A refused subscription (bad filter, not allowed) fails the same way every time.
        let refused = err.status().is_some_and(|s| crate::is_refusal(s.code()));
        if !self.opts.reconnect || refused {
            self.ended = true;
            return Err(err);
        }
        self.attempt += 1;
        Ok(Some(Progress::Reconnecting {
            error: err.to_string(),
            attempt: self.attempt,
        }))
    }

    fn backoff(&self) -> Duration {
        let shift = self.attempt.saturating_sub(1).min(10);
        (self.opts.initial_backoff * (1u32 << shift)).min(self.opts.max_backoff)
    }

    /// Waits for the next batch and calls `f` for each of its events, in seq order.
    /// Returns `Ok(None)` once the stream has ended for good (only without `reconnect`).
    pub async fn next_with<F>(&mut self, mut f: F) -> Result<Option<Progress>, ConsumerError>
    where
        F: FnMut(EventRef<'_>),
    {
        if self.ended {
            return Ok(None);
        }
        if self.inbound.is_none() {
            if self.attempt > 0 {
                tokio::time::sleep(self.backoff()).await;
            }
            return match self.open().await {
                Ok(id) => Ok(Some(Progress::Subscribed { subscription_id: id })),
                Err(e) => self.broke(e),
            };
        }
        let Some(inbound) = self.inbound.as_mut() else {
            return Ok(None);
        };
        match inbound.message().await.and_then(|m| m.map(decode).transpose()) {
            Ok(Some(msg)) => {
                if msg.batch.is_empty() {
                    // No batch (the first message), or one with every field at its default.
                    return Ok(Some(Progress::Batch {
                        events: 0,
                        gaps: Vec::new(),
                        conflated: 0,
                    }));
                }
                // Read straight from the received bytes into the reused batch, then decoded
                // (`BatchDecoder::decode_bytes`); the bytes are a slice of the HTTP/2 DATA frame
                // they came in (`grpc_frames::Message`: never a copy while the batch lies inside
                // one frame, as the producer sends it).
                let batch = &mut self.batch;
                let mut last = None;
                let decoded = self.decoder.decode_bytes(&msg.batch, batch, |e| {
                    last = Some(e.seq);
                    f(e);
                });
                match decoded {
                    Ok(n) => {
                        self.attempt = 0;
                        let epoch_changed = self.resume.is_some_and(|r| r.epoch != batch.epoch);
                        if let Some(seq) = last {
                            self.resume = Some(ResumePoint {
                                epoch: batch.epoch,
                                next_seq: seq + 1,
                            });
                        } else if epoch_changed || self.resume.is_none() {
                            // A new run that has sent nothing yet: resume from its beginning.
                            self.resume = Some(ResumePoint {
                                epoch: batch.epoch,
                                next_seq: 1,
                            });
                        }
                        metrics::counter!(crate::telemetry::EVENTS_RECEIVED).increment(n as u64);
                        Ok(Some(Progress::Batch {
                            events: n,
                            gaps: std::mem::take(&mut batch.gaps),
                            conflated: batch.conflated,
                        }))
                    }
                    Err(e) => {
                        let err = ConsumerError::Protocol(self.address.clone(), e.to_string());
                        self.broke(err)
                    }
                }
            }
            Ok(None) => {
                let err = ConsumerError::Protocol(self.address.clone(), "producer ended the stream".into());
                if self.opts.reconnect {
                    self.broke(err)
                } else {
                    self.ended = true;
                    self.inbound = None;
                    Ok(None)
                }
            }
            Err(s) => self.broke(ConsumerError::Rpc(format!("stream from {}", self.address), s)),
        }
    }
}

/// A message of the subscription as `gma.v1.SubscribeResponse`'s twin: its `batch` a slice of
/// the frame it came in (prost reads a `bytes = "bytes"` field with `copy_to_bytes`, which
/// [`Message`] answers with a slice whenever the field lies inside one frame).
fn decode(message: Message) -> Result<SubscribeResponse, tonic::Status> {
    SubscribeResponse::decode(message).map_err(gma_proto::codec::not_a_message)
}
