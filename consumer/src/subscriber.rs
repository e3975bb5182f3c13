//! Discover producers through the directory and merge their streams.
//!
//! A [`Subscriber`] watches the directory (Search's snapshot + Watch's changes, resumed from the
//! last revision after a directory outage) for producers offering events that match its
//! patterns, runs one [`ProducerStream`] per producer, and forwards everything into one bounded
//! channel: a slow reader slows the streams (and the producers report gaps), never memory.
//! Resume points survive a producer's removal, so a producer that comes back is resumed, not
//! restarted. The watch asks for the subscription's pattern when it has one (so an identity
//! allowed to watch only what it subscribes to can); a refusal of the watch
//! ([`Delivery::DirectoryRefused`]) ends the subscriber instead of being retried.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use gma_core::codec::OwnedEvent;
use gma_core::pattern::Pattern;
use gma_proto::v1 as pb;
use parking_lot::Mutex;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::directory;
use crate::stream::{ProducerStream, Progress, ResumePoint, StreamOptions};

/// What a [`Subscriber`] delivers.
#[derive(Debug, Clone, PartialEq)]
pub enum Delivery {
    /// A producer was found and its stream is starting.
    Discovered { producer: String, address: String },
    /// A (re)subscription was accepted.
    Subscribed { producer: String, subscription_id: u64 },
    /// Events from one batch, in seq order, and where the stream resumes after them (what a
    /// consumer persists with the events to resume exactly after a restart).
    Events {
        producer: String,
        events: Vec<OwnedEvent>,
        resume: ResumePoint,
    },
    /// Events the producer could not deliver (explicit; never silent).
    Gap { producer: String, gap: pb::Gap },
    /// The stream broke and is being re-established.
    Reconnecting { producer: String, error: String },
    /// The producer refused the subscription (invalid filter, not allowed); not retried.
    Refused { producer: String, error: String },
    /// The producer left the directory (removed or its lease expired).
    Gone { producer: String, reason: String },
    /// The directory is unreachable; running streams continue and the subscriber retries.
    DirectoryDown { error: String },
    /// The directory refused the subscriber's watch (PERMISSION_DENIED, UNAUTHENTICATED,
    /// INVALID_ARGUMENT): asking again would not change it, so the subscriber stops (every
    /// stream ends) after delivering this.
    DirectoryRefused { error: String },
}

#[derive(Debug, Clone)]
pub struct SubscriberOptions {
    pub directory: String,
    pub stream: StreamOptions,
    /// Capacity of the merged channel, in deliveries.
    pub capacity: usize,
    /// Where streams of producers without a resume point start: `None` = the producer's
    /// latest events on; `Some(ResumePoint { epoch: 0, next_seq: 1 })` = the oldest it still
    /// holds (what an archiver wants).
    pub default_resume: Option<ResumePoint>,
}

/// Producer records a [`Subscriber`] never follows (see [`Subscriber::start_excluding`]).
#[derive(Debug, Clone, Default)]
pub struct Exclusions {
    /// Record ids: exact, or a prefix followed by `*` (`relay-s1@*`).
    pub ids: Vec<String>,
    /// `(key, value)` pairs: records whose attributes hold any of them are skipped.
    pub attributes: Vec<(String, String)>,
}

impl Exclusions {
    pub fn excludes(&self, p: &pb::ProducerRecord) -> bool {
        self.ids.iter().any(|x| match x.strip_suffix('*') {
            Some(prefix) => p.id.starts_with(prefix),
            None => p.id == *x,
        }) || self
            .attributes
            .iter()
            .any(|(k, v)| p.attributes.get(k).is_some_and(|a| a == v))
    }
}

struct Running {
    address: String,
    task: JoinHandle<()>,
}

/// Handle to a running subscriber; dropping it stops everything.
pub struct Subscriber {
    pub rx: mpsc::Receiver<Delivery>,
    resume: Arc<Mutex<HashMap<String, ResumePoint>>>,
    task: JoinHandle<()>,
}

impl Drop for Subscriber {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Subscriber {
    /// Starts discovering and subscribing. `resume` seeds per-producer resume points (e.g.
    /// saved by a consumer before it restarted).
    pub fn start(opts: SubscriberOptions, resume: HashMap<String, ResumePoint>) -> Subscriber {
        Subscriber::start_excluding(opts, resume, Exclusions::default())
    }

    /// Follows every producer of `stream`'s patterns from its newest events on, without resume
    /// points, through a 256-delivery channel: what live consumers (broker, rescheduler,
    /// dashboard, federation) do.
    pub fn follow(directory: String, stream: StreamOptions) -> Subscriber {
        Subscriber::start(
            SubscriberOptions {
                directory,
                stream,
                capacity: 256,
                default_resume: None,
            },
            HashMap::new(),
        )
    }

    /// Like [`Subscriber::start`], but never follows the producer records `exclude` names
    /// (e.g. a relay's own record).
    pub fn start_excluding(
        opts: SubscriberOptions,
        resume: HashMap<String, ResumePoint>,
        exclude: Exclusions,
    ) -> Subscriber {
        let (tx, rx) = mpsc::channel(opts.capacity.max(1));
        let resume = Arc::new(Mutex::new(resume));
        let task = tokio::spawn(discover(opts, exclude, tx, resume.clone()));
        Subscriber { rx, resume, task }
    }

    pub async fn recv(&mut self) -> Option<Delivery> {
        self.rx.recv().await
    }

    /// The resume point of every producer seen so far.
    pub fn resume_points(&self) -> HashMap<String, ResumePoint> {
        self.resume.lock().clone()
    }
}

fn wants(patterns: &[Pattern], p: &pb::ProducerRecord) -> bool {
    p.events.iter().any(|e| patterns.iter().any(|pat| pat.matches(e)))
}

async fn discover(
    opts: SubscriberOptions,
    exclude: Exclusions,
    tx: mpsc::Sender<Delivery>,
    resume: Arc<Mutex<HashMap<String, ResumePoint>>>,
) {
    let patterns: Vec<Pattern> = opts
        .stream
        .patterns
        .iter()
        .filter_map(|p| Pattern::event(p).ok())
        .collect();
    let mut running: HashMap<String, Running> = HashMap::new();
    let mut from_revision = 0u64;
    let mut backoff = Duration::from_millis(100);
    loop {
        let err = match watch_once(
            &opts,
            &patterns,
            &exclude,
            &tx,
            &resume,
            &mut running,
            &mut from_revision,
        )
        .await
        {
            Ok(()) => return, // receiver dropped
            Err(e) => e,
        };
        let down = match err {
            WatchError::Down(e) => Delivery::DirectoryDown { error: e },
            WatchError::Refused(e) => {
                let ids: Vec<String> = running.keys().cloned().collect();
                for id in ids {
                    stop(&mut running, &id);
                }
                let _ = tx.send(Delivery::DirectoryRefused { error: e }).await;
                return;
            }
        };
        if tx.send(down).await.is_err() {
            return;
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(2));
    }
}

/// Why a directory watch session ended.
enum WatchError {
    /// Unreachable or broken: retried.
    Down(String),
    /// Refused ([`crate::is_refusal`]): not retried.
    Refused(String),
}

impl From<tonic::Status> for WatchError {
    fn from(s: tonic::Status) -> WatchError {
        let msg = format!("directory watch: {} ({:?})", s.message(), s.code());
        if crate::is_refusal(s.code()) {
            WatchError::Refused(msg)
        } else {
            WatchError::Down(msg)
        }
    }
}

/// The event pattern a subscriber watches the directory for: its one pattern (so an identity
/// allowed to watch only what it subscribes to can), or any when it has several (a local
/// filter picks the producers it wants).
fn watch_pattern(patterns: &[String]) -> String {
    match patterns {
        [one] if one != "*" => one.clone(),
        _ => String::new(),
    }
}

/// One directory watch session. Returns Ok(()) when the receiver is gone, Err on watch failure.
async fn watch_once(
    opts: &SubscriberOptions,
    patterns: &[Pattern],
    exclude: &Exclusions,
    tx: &mpsc::Sender<Delivery>,
    resume: &Arc<Mutex<HashMap<String, ResumePoint>>>,
    running: &mut HashMap<String, Running>,
    from_revision: &mut u64,
) -> Result<(), WatchError> {
    let mut client = directory::client(&opts.directory)
        .await
        .map_err(|e| WatchError::Down(e.to_string()))?;
    let req = pb::WatchRequest {
        from_revision: *from_revision,
        kind: pb::RecordKind::Producer as i32,
        event_pattern: watch_pattern(&opts.stream.patterns),
    };
    let mut stream = match client.watch(req.clone()).await {
        Ok(s) => s.into_inner(),
        Err(s) if s.code() == tonic::Code::OutOfRange => {
            // History compacted: re-list from scratch.
            *from_revision = 0;
            client
                .watch(pb::WatchRequest {
                    from_revision: 0,
                    ..req
                })
                .await?
                .into_inner()
        }
        Err(s) => return Err(s.into()),
    };
    // During a re-list (from 0), producers not re-announced before SYNCED are gone.
    let relisting = *from_revision == 0;
    let mut seen = std::collections::HashSet::new();
    loop {
        let ev = match stream.message().await {
            Ok(Some(ev)) => ev,
            Ok(None) => return Err(WatchError::Down("directory watch ended".into())),
            Err(s) => return Err(s.into()),
        };
        let ty = pb::WatchEventType::try_from(ev.r#type).unwrap_or(pb::WatchEventType::Unspecified);
        if ty == pb::WatchEventType::Synced {
            *from_revision = (*from_revision).max(ev.revision + 1);
            if relisting {
                let gone: Vec<String> = running.keys().filter(|k| !seen.contains(*k)).cloned().collect();
                for id in gone {
                    stop(running, &id);
                    if tx
                        .send(Delivery::Gone {
                            producer: id,
                            reason: "not in the directory".into(),
                        })
                        .await
                        .is_err()
                    {
                        return Ok(());
                    }
                }
            }
            continue;
        }
        *from_revision = (*from_revision).max(ev.revision + 1);
        let Some(p) = ev.entry.and_then(directory::producer_of) else {
            continue;
        };
        match ty {
            pb::WatchEventType::Put => {
                seen.insert(p.id.clone());
                if !wants(patterns, &p) || exclude.excludes(&p) {
                    continue;
                }
                if running
                    .get(&p.id)
                    .is_some_and(|r| r.address == p.address && !r.task.is_finished())
                {
                    continue;
                }
                stop(running, &p.id);
                if tx
                    .send(Delivery::Discovered {
                        producer: p.id.clone(),
                        address: p.address.clone(),
                    })
                    .await
                    .is_err()
                {
                    return Ok(());
                }
                let task = tokio::spawn(follow(
                    p.id.clone(),
                    p.address.clone(),
                    opts.stream.clone(),
                    tx.clone(),
                    resume.clone(),
                    opts.default_resume,
                ));
                running.insert(
                    p.id.clone(),
                    Running {
                        address: p.address,
                        task,
                    },
                );
            }
            pb::WatchEventType::Delete if running.contains_key(&p.id) => {
                stop(running, &p.id);
                let reason = if ev.reason.is_empty() {
                    "removed".into()
                } else {
                    ev.reason
                };
                if tx
                    .send(Delivery::Gone {
                        producer: p.id,
                        reason,
                    })
                    .await
                    .is_err()
                {
                    return Ok(());
                }
            }
            _ => {}
        }
        if tx.is_closed() {
            return Ok(());
        }
    }
}

fn stop(running: &mut HashMap<String, Running>, id: &str) {
    if let Some(r) = running.remove(id) {
        r.task.abort();
    }
}

/// Follows one producer until aborted or the receiver is dropped.
async fn follow(
    producer: String,
    address: String,
    opts: StreamOptions,
    tx: mpsc::Sender<Delivery>,
    resume: Arc<Mutex<HashMap<String, ResumePoint>>>,
    default_resume: Option<ResumePoint>,
) {
    let start = resume.lock().get(&producer).copied().or(default_resume);
    let mut stream = ProducerStream::new(
        &address,
        StreamOptions {
            reconnect: true,
            ..opts
        },
    )
    .with_resume(start);
    loop {
        let mut events = Vec::new();
        let progress = stream.next_with(|e| events.push(e.to_owned_event())).await;
        if let Some(rp) = stream.resume_point() {
            resume.lock().insert(producer.clone(), rp);
        }
        let deliveries: Vec<Delivery> = match progress {
            Ok(Some(Progress::Batch { gaps, .. })) => {
                let mut d: Vec<Delivery> = gaps
                    .into_iter()
                    .map(|gap| Delivery::Gap {
                        producer: producer.clone(),
                        gap,
                    })
                    .collect();
                if !events.is_empty() {
                    d.push(Delivery::Events {
                        producer: producer.clone(),
                        events,
                        resume: stream.resume_point().unwrap_or_default(),
                    });
                }
                d
            }
            Ok(Some(Progress::Subscribed { subscription_id })) => vec![Delivery::Subscribed {
                producer: producer.clone(),
                subscription_id,
            }],
            Ok(Some(Progress::Reconnecting { error, .. })) => vec![Delivery::Reconnecting {
                producer: producer.clone(),
                error,
            }],
            Ok(None) => return,
            Err(e) => vec![Delivery::Refused {
                producer: producer.clone(),
                error: e.to_string(),
            }],
        };
        let refused = matches!(deliveries.last(), Some(Delivery::Refused { .. }));
        for d in deliveries {
            if tx.send(d).await.is_err() {
                return;
            }
        }
        if refused {
            return;
        }
    }
}
