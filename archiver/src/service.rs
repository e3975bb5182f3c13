//! The `Archive` gRPC service: queries streamed from the storage scan, the series held, figures.
//!
//! Every data RPC asks the policy with `archive.query` on the requested pattern. An identity
//! granted only summaries (`effect = "summary"`) is answered from the archived summary series
//! alone (`<name>.avg1m`, `.avg10m`, `.avg60m`, stored when a producer derives them), never
//! from raw samples, and not with aggregates of raw samples either; when no summary series
//! matches, the answer is `PERMISSION_DENIED` naming the rule and the way out. [`DOORS`] lists
//! each RPC with its decision.

use std::collections::BTreeSet;
use std::pin::Pin;
use std::sync::Arc;

use futures::Stream;
use gma_core::authz::{Action, Decision, Door, Identity};
use gma_core::guard::Gate;
use gma_core::pattern::Pattern;
use gma_core::Refuse;
use gma_proto::v1::{self as pb, archive_server::Archive};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use crate::error::Error;
use crate::store::{Agg, Points, QuerySpec, Store};
use crate::Counters;

/// Default points per response message.
pub const DEFAULT_MAX_POINTS: usize = 10_000;
/// Most points per response message a client may ask for.
pub const MAX_POINTS: usize = 100_000;
/// Response messages buffered ahead of a slow reader.
const QUERY_BUFFER: usize = 4;

/// The doors of the `Archive` service.
pub const DOORS: &[Door] = &[
    Door::policy(
        "/gma.v1.Archive/Query",
        &[Action::ArchiveQuery],
        "the archived summary series among the matches (raw and aggregates of raw \
                       samples never); PERMISSION_DENIED naming the rule when none matches",
    ),
    Door::policy(
        "/gma.v1.Archive/Series",
        &[Action::ArchiveQuery],
        "the archived summary series among the matches; PERMISSION_DENIED naming \
                       the rule when none matches",
    ),
    Door::policy(
        "/gma.v1.Archive/Stats",
        &[Action::ArchiveQuery],
        "PERMISSION_DENIED: the figures cover every series (archive.query allowed \
                       on \"*\" is needed)",
    ),
    Door::open("/gma.v1.Archive/Version", "served (versions only, no data)"),
];

pub(crate) struct ArchiveService {
    pub store: Arc<Store>,
    pub gate: Arc<Gate>,
    pub counters: Arc<Counters>,
}

fn agg_of(a: i32) -> Result<Agg, Error> {
    Ok(match pb::Aggregate::try_from(a) {
        Ok(pb::Aggregate::Raw) => Agg::Raw,
        Ok(pb::Aggregate::Mean) => Agg::Mean,
        Ok(pb::Aggregate::Min) => Agg::Min,
        Ok(pb::Aggregate::Max) => Agg::Max,
        Ok(pb::Aggregate::Sum) => Agg::Sum,
        Ok(pb::Aggregate::Count) => Agg::Count,
        Ok(pb::Aggregate::P50) => Agg::P50,
        Ok(pb::Aggregate::P90) => Agg::P90,
        Ok(pb::Aggregate::P99) => Agg::P99,
        Err(_) => return Err(Error::invalid_argument(format!("aggregate {a} is unknown"))),
    })
}

impl ArchiveService {
    fn readable(
        &self,
        who: &Identity,
        name: &Pattern,
        source: Option<&Pattern>,
    ) -> Result<Option<BTreeSet<String>>, Error> {
        readable(&self.store, &self.gate, who, name, source)
    }
}

/// The event names `who` may read among the series matching `name` (and `source`):
/// `None` = all of them (allowed raw); for a summary-only grant, the summary series it may
/// read, or `PERMISSION_DENIED` when there is none. A deny is `PERMISSION_DENIED` too. The one
/// gate of every door reading the archive (this service, the PromQL API).
pub(crate) fn readable(
    store: &Store,
    gate: &Gate,
    who: &Identity,
    name: &Pattern,
    source: Option<&Pattern>,
) -> Result<Option<BTreeSet<String>>, Error> {
    let grant = gate.authorize(who, Action::ArchiveQuery, &[name.as_str()])?;
    if grant.decision == Decision::Allow {
        return Ok(None);
    }
    let names: BTreeSet<String> = store
        .series(name, source)
        .into_iter()
        .map(|s| s.name)
        .filter(|n| gate.raw_allowed(who, Action::ArchiveQuery, n))
        .collect();
    if names.is_empty() {
        let p = name.as_str();
        return Err(gate
            .summary_only(
                who,
                p,
                &grant,
                &format!(
                    "no archived summary series matches it; ask for {p}.avg1m, {p}.avg10m or \
                 {p}.avg60m (archived once a producer derives them)"
                ),
            )
            .into());
    }
    Ok(Some(names))
}

fn patterns(name: &str, source: &str) -> Result<(Pattern, Option<Pattern>), Error> {
    let name = if name.is_empty() { "*" } else { name };
    let p = Pattern::event(name).map_err(|e| Error::invalid_argument(e.to_string()))?;
    let s = if source.is_empty() {
        None
    } else {
        Some(Pattern::source(source).map_err(|e| Error::invalid_argument(e.to_string()))?)
    };
    Ok((p, s))
}

/// Validates a query request into a [`QuerySpec`].
pub fn spec_of(req: &pb::ArchiveQueryRequest) -> Result<QuerySpec, Error> {
    let (name, source) = patterns(&req.pattern, &req.source)?;
    if req.field.len() > 256 {
        return Err(Error::invalid_argument("field: longer than 256 bytes"));
    }
    if req.to_ns <= req.from_ns {
        return Err(Error::invalid_argument(format!(
            "inverted or empty range: to ({}) must be after from ({})",
            gma_core::time::format_rfc3339(req.to_ns),
            gma_core::time::format_rfc3339(req.from_ns)
        )));
    }
    if req.step_ns < 0 {
        return Err(Error::invalid_argument(format!(
            "step {} ns must be positive (or 0 for none)",
            req.step_ns
        )));
    }
    let agg = agg_of(req.aggregate)?;
    if agg == Agg::Raw && req.step_ns > 0 {
        return Err(Error::invalid_argument(
            "a step needs an aggregate (mean, min, max, sum, count, p50, p90, p99)",
        ));
    }
    let max_points = match req.max_points as usize {
        0 => DEFAULT_MAX_POINTS,
        n => n.min(MAX_POINTS),
    };
    Ok(QuerySpec {
        name,
        names: None,
        source,
        field: (!req.field.is_empty()).then(|| req.field.clone()),
        from_ns: req.from_ns,
        to_ns: req.to_ns,
        step_ns: (req.step_ns > 0).then_some(req.step_ns),
        agg,
        max_points,
    })
}

fn to_pb(p: Points) -> pb::SeriesPoints {
    pb::SeriesPoints {
        name: p.name,
        source: p.source,
        field: p.field,
        timestamps_ns: p.timestamps,
        values: p.values,
        texts: p.texts,
    }
}

type QueryStream = Pin<Box<dyn Stream<Item = Result<pb::ArchiveQueryResponse, Status>> + Send>>;

#[tonic::async_trait]
impl Archive for ArchiveService {
    type QueryStream = QueryStream;

    async fn query(&self, req: Request<pb::ArchiveQueryRequest>) -> Result<Response<QueryStream>, Status> {
        let mut spec = spec_of(req.get_ref())?;
        let who = self.gate.admit(&req)?;
        spec.names = self.readable(&who, &spec.name, spec.source.as_ref())?;
        let known = self.store.series(&spec.name, spec.source.as_ref());
        if !known.iter().any(|s| {
            spec.field.as_ref().is_none_or(|f| &s.field == f)
                && spec.names.as_ref().is_none_or(|n| n.contains(&s.name))
        }) {
            return Err(Error::not_found(format!(
                "no series stored for {}{}{}",
                gma_core::clip(spec.name.as_str(), 80),
                spec.source
                    .as_ref()
                    .map(|p| format!(" from {}", gma_core::clip(p.as_str(), 80)))
                    .unwrap_or_default(),
                spec.field
                    .as_ref()
                    .map(|f| format!(" with a field {:?}", gma_core::clip(f, 80)))
                    .unwrap_or_default()
            ))
            .into());
        }
        let (tx, rx) = mpsc::channel(QUERY_BUFFER);
        let store = self.store.clone();
        // The scan runs on a blocking thread and hands pieces over as it goes: a large result
        // is never built in memory, and a slow reader slows the scan.
        tokio::task::spawn_blocking(move || {
            let mut emit = |p: Points| {
                tx.blocking_send(Ok(pb::ArchiveQueryResponse {
                    series: vec![to_pb(p)],
                }))
                .is_ok()
            };
            if let Err(e) = store.query(&spec, &mut emit) {
                let _ = tx.blocking_send(Err(Error::from(e).into()));
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn series(
        &self,
        req: Request<pb::ArchiveSeriesRequest>,
    ) -> Result<Response<pb::ArchiveSeriesResponse>, Status> {
        let (name, source) = patterns(&req.get_ref().pattern, &req.get_ref().source)?;
        let who = self.gate.admit(&req)?;
        let only = self.readable(&who, &name, source.as_ref())?;
        let series = self
            .store
            .series(&name, source.as_ref())
            .into_iter()
            .filter(|s| only.as_ref().is_none_or(|n| n.contains(&s.name)))
            .map(|s| pb::ArchivedSeries {
                name: s.name,
                source: s.source,
                field: s.field,
                unit: s.unit,
                r#type: if s.is_string {
                    pb::FieldType::String as i32
                } else {
                    pb::FieldType::Double as i32
                },
                samples: s.samples,
                first_ns: s.first_ts,
                last_ns: s.last_ts,
            })
            .collect();
        Ok(Response::new(pb::ArchiveSeriesResponse { series }))
    }

    async fn stats(
        &self,
        req: Request<pb::ArchiveStatsRequest>,
    ) -> Result<Response<pb::ArchiveStatsResponse>, Status> {
        let (who, grant) = self.gate.check(&req, Action::ArchiveQuery, &["*"])?;
        if grant.decision != Decision::Allow {
            return Err(self
                .gate
                .summary_only(
                    &who,
                    "*",
                    &grant,
                    "the archive's figures cover every series it holds; they need archive.query \
                 allowed on \"*\"",
                )
                .into());
        }
        let s = self.store.stats();
        let c = &self.counters;
        Ok(Response::new(pb::ArchiveStatsResponse {
            streams: s.streams,
            series: s.series,
            samples: s.samples,
            bytes_on_disk: s.bytes_on_disk,
            bytes_per_sample: s.bytes_per_sample,
            ingest_samples_per_s: c.ingest_rate(),
            producers: c.producers(),
            wal_bytes: s.wal_bytes,
            kept_abnormal: c.get(&c.kept_abnormal),
            sampled_out: c.get(&c.sampled_out),
            retention_deleted: c.get(&c.retention_deleted),
            gap_events: c.get(&c.gap_events),
            received: c
                .received()
                .into_iter()
                .map(|(producer, epoch, last_seq, events)| pb::ArchiveReceived {
                    producer,
                    epoch,
                    last_seq,
                    events,
                })
                .collect(),
        }))
    }

    async fn version(&self, _: Request<pb::VersionRequest>) -> Result<Response<pb::VersionResponse>, Status> {
        gma_core::endpoint::version("archiver")
    }
}
