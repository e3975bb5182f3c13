//! The grid: resource queries through the hierarchy of federation endpoints, and reservations
//! through the endpoint that manages a resource (docs/federation.md, "Grid queries" and
//! "Reservations through the owner").
//!
//! # Query semantics
//!
//! A query carries the broker's job fields as requirements and a budget of `levels`: the number
//! of links it may still travel (absent = unlimited). A manager that receives it:
//!
//! 1. matches its own hosts (the live view, fresh data only, reserved CPUs taken off): a host
//!    matches when it meets the job's requirements and has the job's CPUs free now;
//! 2. when `levels > 0`, sends it with `levels − 1` to each of its children (inferiors), in
//!    parallel, never to the manager it came from nor to one on its path, and merges the answers;
//! 3. when nothing matched in 1–2, `levels > 0`, and the query did not come from its parent
//!    (it was asked first, or came up from a child), escalates it with `levels − 1` to its
//!    parent, which does 1–3 in turn (so it also searches its other children).
//!
//! So `levels = 0` is the manager asked alone; every resource answered is at most `levels`
//! links from it; and a query goes up only from a subtree that had nothing. A manager answers
//! one query id once: a second arrival through another link (an echo) answers empty and is
//! counted in `duplicates`, so no resource is answered twice.

pub mod book;

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use gma_broker::{rank_candidates, Job, Policy, RankConfig, Resource, Snapshot};
use gma_core::authz::{Action, Door};
use gma_core::guard::Gate;
use gma_core::Refuse;
use gma_proto::v1 as pb;
use parking_lot::Mutex;
use tonic::{Request, Response, Status};

use crate::config::validate_site;
use crate::error::Error;
use crate::site::{Link, Role};
use book::{Ask, Book, Rec, Refusal};

/// Most managers a query may pass (its path).
pub const MAX_PATH: usize = 64;
pub const DEFAULT_DEADLINE_MS: u32 = 5_000;
pub const MAX_DEADLINE_MS: u32 = 60_000;
pub const DEFAULT_RESULTS: u32 = 1_000;
pub const MAX_RESULTS: u32 = 10_000;
/// Query ids remembered (echo detection), and for how long.
const SEEN_CAP: usize = 4_096;
const SEEN_NS: i64 = (MAX_DEADLINE_MS as i64) * 1_000_000;
/// Time each hop keeps for itself out of the deadline it got.
const HOP_MARGIN_MS: u64 = 100;
/// The longest reservation, and how far ahead one may start.
const MAX_RESERVE_S: i64 = 366 * 86_400;

/// What the grid needs from the running endpoint (implemented by `service::Shared`).
pub trait Endpoint: Send + Sync + 'static {
    fn site(&self) -> &str;
    /// The endpoint's clock, ns.
    fn now(&self) -> i64;
    fn grid(&self) -> &Grid;
    /// The site's live view of its hosts now.
    fn live(&self) -> Snapshot;
    fn links(&self) -> Vec<Link>;
    fn rank(&self) -> &RankConfig;
    /// Real seconds per job second.
    fn time_scale(&self) -> f64;
    fn gate(&self) -> &Gate;
    /// `Federation.Query` at linked site `site`, within `timeout`; the error says why not (the
    /// site's own refusal with its code, or UNAVAILABLE).
    fn query_site(
        &self,
        site: &str,
        q: pb::GridQuery,
        timeout: Duration,
    ) -> impl Future<Output = Result<pb::GridAnswer, Error>> + Send;
    /// Submits a job here (placed by the site's own manager); its global id.
    fn submit(self: &Arc<Self>, job: Job) -> Result<String, Error>;
}

/// Query ids answered lately.
#[derive(Debug, Default)]
struct Seen {
    order: VecDeque<(i64, String)>,
    ids: HashSet<String>,
}

impl Seen {
    /// True the first time `id` is seen (within the memory).
    fn first(&mut self, id: &str, now: i64) -> bool {
        while let Some((t, old)) = self.order.front() {
            if now - *t <= SEEN_NS && self.order.len() < SEEN_CAP {
                break;
            }
            self.ids.remove(old);
            self.order.pop_front();
        }
        if !self.ids.insert(id.to_string()) {
            return false;
        }
        self.order.push_back((now, id.to_string()));
        true
    }
}

type Withheld = (Arc<[Arc<Resource>]>, BTreeMap<String, u32>, Arc<[Arc<Resource>]>);

/// The grid state of one endpoint: its address, its reservations, the query ids it answered.
pub struct Grid {
    addr: String,
    epoch: u64,
    book: Mutex<Book>,
    seen: Mutex<Seen>,
    cache: Mutex<Option<Withheld>>,
}

impl Grid {
    /// `addr`: the endpoint's address as answers name it.
    pub fn new(addr: String, epoch: u64) -> Grid {
        Grid {
            addr,
            epoch,
            book: Mutex::new(Book::new()),
            seen: Mutex::new(Seen::default()),
            cache: Mutex::new(None),
        }
    }

    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// `snap` with the CPUs of reservations not yet started taken off their hosts (what the
    /// site's own placement and the queries see). The same resources as long as neither the
    /// view nor the reservations change.
    pub fn withhold(&self, snap: Snapshot) -> Snapshot {
        let held = self.book.lock().withheld_all(snap.now_ns / 1_000_000_000);
        if held.is_empty() {
            return snap;
        }
        let mut cache = self.cache.lock();
        if let Some((input, h, out)) = cache.as_ref() {
            if Arc::ptr_eq(input, &snap.resources) && *h == held {
                return Snapshot {
                    now_ns: snap.now_ns,
                    resources: out.clone(),
                };
            }
        }
        let out: Arc<[Arc<Resource>]> = snap
            .resources
            .iter()
            .map(|r| match held.get(&r.name) {
                Some(c) if r.free_cpus.is_finite() => {
                    let mut x = Resource::clone(r);
                    x.free_cpus = (x.free_cpus - f64::from(*c)).max(0.0);
                    Arc::new(x)
                }
                _ => r.clone(),
            })
            .collect();
        *cache = Some((snap.resources.clone(), held, out.clone()));
        Snapshot {
            now_ns: snap.now_ns,
            resources: out,
        }
    }

    fn reservation(&self, site: &str, r: &Rec) -> pb::GridReservation {
        pb::GridReservation {
            number: r.number,
            site: site.to_string(),
            host: r.host.clone(),
            cpus: r.cpus,
            start_s: r.start_s,
            end_s: r.end_s,
            exclusive: r.exclusive,
            state: r.state.as_str().into(),
            job_id: r.job_id.clone(),
            owner: r.owner.clone(),
            epoch: self.epoch,
        }
    }
}

fn valid_query_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 64
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// The checked parts of a query.
struct Checked {
    id: String,
    job: Job,
    deadline: Instant,
    max_results: usize,
}

fn check(q: &pb::GridQuery, from: Option<&str>, me: &str) -> Result<Checked, Error> {
    let bad = |m: String| Err(Error::invalid_argument(m));
    let id = match (q.query_id.as_str(), from) {
        ("", None) => format!("{me}-{:016x}", rand::random::<u64>()),
        (id, _) if valid_query_id(id) => id.to_string(),
        (id, _) => {
            return bad(format!(
                "query_id {:?}: 1..=64 bytes of letters, digits, '.', '_', '-'",
                gma_core::clip(id, 80)
            ))
        }
    };
    let spec = q
        .requirements
        .as_ref()
        .ok_or_else(|| Error::invalid_argument("requirements: give the job's requirements"))?;
    let job = Job::from_proto(spec, "requirements.").map_err(|e| Error::invalid_argument(e.to_string()))?;
    if q.path.len() > MAX_PATH {
        return bad(format!(
            "path: {} managers, at most {MAX_PATH}: the hierarchy is deeper than a query may travel",
            q.path.len()
        ));
    }
    let mut seen = HashSet::new();
    for s in &q.path {
        validate_site(s).map_err(|e| Error::invalid_argument(format!("path: {e}")))?;
        if !seen.insert(s.as_str()) {
            return bad(format!("path: {s:?} appears twice"));
        }
    }
    match from {
        None if !q.path.is_empty() => {
            return bad("path: must be empty when an application asks (the endpoints fill it)".into())
        }
        Some(f) if q.path.last().map(String::as_str) != Some(f) => {
            return bad(format!("path: must end with the calling site {f:?}"))
        }
        _ => {}
    }
    if q.path.iter().any(|s| s == me) {
        return Err(Error::failed_precondition(format!(
            "query {id} already passed through {me} (path {:?}): the links form a loop",
            q.path
        )));
    }
    if q.deadline_ms > MAX_DEADLINE_MS {
        return bad(format!("deadline_ms: at most {MAX_DEADLINE_MS}"));
    }
    if q.max_results > MAX_RESULTS {
        return bad(format!("max_results: at most {MAX_RESULTS}"));
    }
    let deadline_ms = if q.deadline_ms == 0 {
        DEFAULT_DEADLINE_MS
    } else {
        q.deadline_ms
    };
    let max_results = if q.max_results == 0 {
        DEFAULT_RESULTS
    } else {
        q.max_results
    };
    Ok(Checked {
        id,
        job,
        deadline: Instant::now() + Duration::from_millis(u64::from(deadline_ms)),
        max_results: max_results as usize,
    })
}

/// The hosts of `snap` that match `job` now: they meet its requirements, their data is fresh,
/// and they have its CPUs free. Best (earliest predicted delivery) first.
pub fn local_matches(
    snap: &Snapshot,
    job: &Job,
    rank: &RankConfig,
    site: &str,
    addr: &str,
) -> Vec<pb::GridResource> {
    let Ok(ranked) = rank_candidates(snap, job, Policy::Ttd, rank) else {
        return Vec::new();
    };
    let by_name: BTreeMap<&str, &Resource> = snap.resources.iter().map(|r| (r.name.as_str(), &**r)).collect();
    ranked
        .into_iter()
        .filter(|c| !c.stale)
        .filter_map(|c| {
            let r = by_name.get(c.resource.as_str())?;
            (r.free_cpus.is_finite() && r.free_cpus >= f64::from(job.cpus)).then(|| pb::GridResource {
                site: site.to_string(),
                endpoint: addr.to_string(),
                host: r.name.clone(),
                arch: r.arch.clone(),
                os: r.os.clone(),
                cpus_total: count(r.total_cpus),
                cpus_free: count(r.free_cpus),
                memory_mb: r.memory_mb,
                load1: r.load1,
                completion_s: c.completion_s,
                distance: 0,
            })
        })
        .collect()
}

fn count(x: f64) -> u32 {
    if x.is_finite() {
        x.max(0.0).min(f64::from(u32::MAX)).floor() as u32
    } else {
        0
    }
}

/// Adds an answer from one link further away.
fn absorb(out: &mut pb::GridAnswer, a: pb::GridAnswer, cap: usize) {
    let room = cap.saturating_sub(out.resources.len());
    if a.resources.len() > room || a.truncated {
        out.truncated = true;
    }
    out.resources
        .extend(a.resources.into_iter().take(room).map(|mut r| {
            r.distance = r.distance.saturating_add(1);
            r
        }));
    for (to, from) in [
        (&mut out.answered, a.answered),
        (&mut out.unreached, a.unreached),
        (&mut out.escalations, a.escalations),
    ] {
        to.extend(from.into_iter().take(4 * MAX_PATH * 64));
    }
    out.duplicates = out.duplicates.saturating_add(a.duplicates);
}

/// Asks `sites` in parallel and merges their answers into `out`.
async fn ask_all<E: Endpoint>(
    ep: &Arc<E>,
    sites: &[String],
    sub: &pb::GridQuery,
    deadline: Instant,
    out: &mut pb::GridAnswer,
    cap: usize,
) {
    if sites.is_empty() {
        return;
    }
    let left = deadline.saturating_duration_since(Instant::now());
    let margin = Duration::from_millis(HOP_MARGIN_MS);
    if left <= margin * 2 {
        for s in sites {
            out.unreached
                .push(format!("{s}: no time left within the deadline"));
        }
        return;
    }
    let mut q = sub.clone();
    q.deadline_ms = (left - margin).as_millis().min(u128::from(MAX_DEADLINE_MS)) as u32;
    let timeout = left - margin / 2;
    let calls = sites.iter().map(|s| {
        let q = q.clone();
        async move { (s, ep.query_site(s, q, timeout).await) }
    });
    for (s, r) in futures::future::join_all(calls).await {
        match r {
            Ok(a) => absorb(out, a, cap),
            Err(why) => out
                .unreached
                .push(format!("{s}: {}", gma_core::clip(&why.to_string(), 512))),
        }
    }
}

/// Answers a query here: the caller is `from` (a linked site) or an application (`None`).
pub async fn answer<E: Endpoint>(
    ep: Arc<E>,
    q: pb::GridQuery,
    from: Option<String>,
) -> Result<pb::GridAnswer, Error> {
    let me = ep.site().to_string();
    let c = check(&q, from.as_deref(), &me)?;
    metrics::counter!("gma_federation_grid_queries_total").increment(1);
    let grid = ep.grid();
    if !grid.seen.lock().first(&c.id, ep.now()) {
        return Ok(pb::GridAnswer {
            query_id: c.id,
            duplicates: 1,
            ..Default::default()
        });
    }
    let snap = grid.withhold(ep.live());
    let mut local = local_matches(&snap, &c.job, ep.rank(), &me, grid.addr());
    let truncated = local.len() > c.max_results;
    local.truncate(c.max_results);
    let mut out = pb::GridAnswer {
        query_id: c.id.clone(),
        resources: local,
        answered: vec![me.clone()],
        truncated,
        ..Default::default()
    };
    let travel = q.levels.is_none_or(|l| l > 0);
    if travel {
        let links = ep.links();
        let mut path = q.path.clone();
        path.push(me.clone());
        let sub = pb::GridQuery {
            query_id: c.id.clone(),
            requirements: q.requirements.clone(),
            levels: q.levels.map(|l| l - 1),
            path: path.clone(),
            deadline_ms: 0,
            max_results: c.max_results as u32,
        };
        let next = |role: Role| -> Vec<String> {
            links
                .iter()
                .filter(|l| l.role == role && !path.contains(&l.site) && Some(&l.site) != from.as_ref())
                .map(|l| l.site.clone())
                .collect()
        };
        // Down: every child.
        ask_all(&ep, &next(Role::Child), &sub, c.deadline, &mut out, c.max_results).await;
        // Up: only when the subtree had nothing, and never back down the way it came.
        let came_down = from
            .as_ref()
            .is_some_and(|f| links.iter().any(|l| &l.site == f && l.role != Role::Child));
        if out.resources.is_empty() && !came_down {
            let parents = next(Role::Parent);
            for p in &parents {
                out.escalations.push(format!("{me}>{p}"));
            }
            ask_all(&ep, &parents, &sub, c.deadline, &mut out, c.max_results).await;
        }
    }
    out.resources.sort_by(|a, b| {
        a.distance
            .cmp(&b.distance)
            .then(a.completion_s.total_cmp(&b.completion_s))
            .then_with(|| a.site.cmp(&b.site))
            .then_with(|| a.host.cmp(&b.host))
    });
    Ok(out)
}

fn refusal(r: Refusal) -> Error {
    match r {
        Refusal::Never(m) => Error::failed_precondition(m),
        Refusal::Busy { reason, .. } => Error::resource_exhausted(reason),
        Refusal::Unknown(n) => Error::not_found(format!(
            "no reservation {n} here (released, ended, or granted by another endpoint or incarnation)"
        )),
        Refusal::NotOwner(m) => Error::permission_denied(m),
        Refusal::State(m) => Error::failed_precondition(m),
        Refusal::Full => Error::resource_exhausted(format!(
            "{} reservations held here: release some",
            book::MAX_RESERVATIONS
        )),
    }
}

/// A reservation request, checked against the live view: the ask for the book.
fn reserve_ask<E: Endpoint>(ep: &E, r: &pb::GridReserveRequest, owner: String) -> Result<Ask, Error> {
    let bad = |m: String| Error::invalid_argument(m);
    if r.host.is_empty() || r.host.len() > 256 {
        return Err(bad(
            "host: give the host to reserve (1..=256 bytes, from gma grid query)".into(),
        ));
    }
    let spec = r
        .job
        .as_ref()
        .ok_or_else(|| bad("job: give the job that will run there".into()))?;
    let mut job = Job::from_proto(spec, "job.").map_err(|e| bad(e.to_string()))?;
    let now_ns = ep.now();
    let now_s = now_ns / 1_000_000_000;
    let start_s = if r.start_s == 0 { now_s } else { r.start_s };
    if start_s < now_s - 1 {
        return Err(bad(format!(
            "start_s {start_s} is in the past (now {now_s}): give 0 for now"
        )));
    }
    if start_s - now_s > MAX_RESERVE_S {
        return Err(bad(format!("start_s: at most {MAX_RESERVE_S} s ahead")));
    }
    let duration_s = if r.duration_s == 0 {
        ((job.walltime() as f64) * ep.time_scale()).ceil().max(1.0) as i64
    } else {
        i64::from(r.duration_s)
    };
    if duration_s > MAX_RESERVE_S {
        return Err(bad(format!("duration_s: at most {MAX_RESERVE_S}")));
    }
    let snap = ep.live();
    let host = snap
        .resources
        .iter()
        .find(|x| x.name == r.host)
        .ok_or_else(|| {
            Error::not_found(format!(
                "no host {:?} at site {}: reserve a host this endpoint manages (gma grid query names it)",
                gma_core::clip(&r.host, 256),
                ep.site()
            ))
        })?
        .clone();
    job.candidates = vec![host.name.clone()];
    let one = Snapshot {
        now_ns: snap.now_ns,
        resources: Arc::from(vec![host.clone()]),
    };
    let fits = rank_candidates(&one, &job, Policy::Ttd, ep.rank()).map_err(|e| bad(e.to_string()))?;
    if fits.iter().all(|c| c.stale) {
        return Err(Error::failed_precondition(format!(
            "host {:?} does not meet the job's requirements (cpus, memory_mb, arch, software) or its data is stale",
            host.name
        )));
    }
    Ok(Ask {
        host: host.name.clone(),
        capacity: count(host.total_cpus),
        free_now: host.free_cpus.is_finite().then(|| count(host.free_cpus)),
        job,
        exclusive: r.exclusive,
        start_s,
        duration_s,
        owner,
    })
}

/// What a summary-only grant is told.
const RAW_ONLY: &str = "grid answers and reservations name hosts: ask for an allow grant";

/// The identity that reserves (the holder of what it reserves): it needs an allow grant.
fn owner<T>(gate: &Gate, req: &Request<T>, op: &str) -> Result<String, Error> {
    let who = gate.check_raw(req, Action::Reserve, &[op], RAW_ONLY)?;
    Ok(who.to_string())
}

/// The `Grid` service (applications): query the hierarchy from this endpoint, reserve, start
/// and release hosts this endpoint manages.
pub struct GridService<E> {
    pub ep: Arc<E>,
}

#[tonic::async_trait]
impl<E: Endpoint> pb::grid_server::Grid for GridService<E> {
    async fn query(&self, req: Request<pb::GridQuery>) -> Result<Response<pb::GridAnswer>, Status> {
        self.ep
            .gate()
            .check_raw(&req, Action::Job, &["grid.query"], RAW_ONLY)?;
        Ok(Response::new(
            answer(self.ep.clone(), req.into_inner(), None).await?,
        ))
    }

    async fn reserve(
        &self,
        req: Request<pb::GridReserveRequest>,
    ) -> Result<Response<pb::GridReservation>, Status> {
        let ep = &self.ep;
        let who = owner(ep.gate(), &req, "grid.reserve")?;
        let ask = reserve_ask(&**ep, req.get_ref(), who)?;
        let now_s = ep.now() / 1_000_000_000;
        let rec = ep.grid().book.lock().reserve(ask, now_s).map_err(refusal)?;
        metrics::counter!("gma_federation_grid_reservations_total").increment(1);
        tracing::info!(number = rec.number, host = %rec.host, cpus = rec.cpus, exclusive = rec.exclusive, "reserved");
        // The site's placement sees the withheld CPUs at its next step.
        Ok(Response::new(ep.grid().reservation(ep.site(), &rec)))
    }

    async fn start(
        &self,
        req: Request<pb::GridReservationRef>,
    ) -> Result<Response<pb::GridReservation>, Status> {
        let ep = &self.ep;
        let who = owner(ep.gate(), &req, "grid.start")?;
        let n = req.get_ref().number;
        let now_s = ep.now() / 1_000_000_000;
        let rec = ep.grid().book.lock().begin(n, &who, now_s).map_err(refusal)?;
        let mut job = rec.job.clone();
        job.candidates = vec![rec.host.clone()];
        match ep.submit(job) {
            Ok(id) => {
                let rec = ep.grid().book.lock().started(n, &id).unwrap_or(rec);
                Ok(Response::new(ep.grid().reservation(ep.site(), &rec)))
            }
            Err(e) => {
                ep.grid().book.lock().unbegin(n);
                Err(e.into())
            }
        }
    }

    async fn release(
        &self,
        req: Request<pb::GridReservationRef>,
    ) -> Result<Response<pb::GridReservation>, Status> {
        let ep = &self.ep;
        let who = owner(ep.gate(), &req, "grid.release")?;
        let now_s = ep.now() / 1_000_000_000;
        let rec = ep
            .grid()
            .book
            .lock()
            .release(req.get_ref().number, &who, now_s)
            .map_err(refusal)?;
        let mut out = ep.grid().reservation(ep.site(), &rec);
        out.state = "released".into();
        Ok(Response::new(out))
    }

    async fn list(&self, req: Request<pb::GridListRequest>) -> Result<Response<pb::GridListReply>, Status> {
        let ep = &self.ep;
        owner(ep.gate(), &req, "grid.list")?;
        let now_s = ep.now() / 1_000_000_000;
        let mut book = ep.grid().book.lock();
        book.expire(now_s);
        let reservations = book
            .list()
            .iter()
            .map(|r| ep.grid().reservation(ep.site(), r))
            .collect();
        Ok(Response::new(pb::GridListReply { reservations }))
    }
}

/// The doors of the `Grid` service (on the federation endpoint).
pub const DOORS: &[Door] = &[
    Door::policy(
        "/gma.v1.Grid/Query",
        &[Action::Job],
        "PERMISSION_DENIED naming the rule (job needs an allow grant on grid.query: the answer names hosts)",
    ),
    Door::policy(
        "/gma.v1.Grid/Reserve",
        &[Action::Reserve],
        "PERMISSION_DENIED naming the rule (reservation needs an allow grant on grid.reserve)",
    ),
    Door::policy(
        "/gma.v1.Grid/Start",
        &[Action::Reserve],
        "PERMISSION_DENIED naming the rule (reservation needs an allow grant on grid.start)",
    ),
    Door::policy(
        "/gma.v1.Grid/Release",
        &[Action::Reserve],
        "PERMISSION_DENIED naming the rule (reservation needs an allow grant on grid.release)",
    ),
    Door::policy(
        "/gma.v1.Grid/List",
        &[Action::Reserve],
        "PERMISSION_DENIED naming the rule (reservation needs an allow grant on grid.list)",
    ),
];

#[cfg(test)]
mod tests {
    use super::*;

    fn q(id: &str, path: &[&str]) -> pb::GridQuery {
        pb::GridQuery {
            query_id: id.into(),
            requirements: Some(
                Job {
                    name: "q".into(),
                    cpus: 2,
                    reference_time_s: 10.0,
                    ..Job::default()
                }
                .to_proto(),
            ),
            levels: None,
            path: path.iter().map(|s| s.to_string()).collect(),
            deadline_ms: 0,
            max_results: 0,
        }
    }

    #[test]
    fn every_field_is_checked() {
        let code =
            |q: &pb::GridQuery, from: Option<&str>| check(q, from, "B").err().map(|e| Status::from(e).code());
        use tonic::Code;
        assert_eq!(
            code(&q("", &[]), None),
            None,
            "an application may leave the id to us"
        );
        assert_eq!(code(&q("", &["A"]), Some("A")), Some(Code::InvalidArgument));
        assert_eq!(code(&q("x y", &[]), None), Some(Code::InvalidArgument));
        assert_eq!(code(&q(&"x".repeat(65), &[]), None), Some(Code::InvalidArgument));
        assert_eq!(
            code(&q("a", &["A"]), None),
            Some(Code::InvalidArgument),
            "apps give no path"
        );
        assert_eq!(
            code(&q("a", &["A"]), Some("C")),
            Some(Code::InvalidArgument),
            "path ends with the caller"
        );
        assert_eq!(code(&q("a", &["A", "A"]), Some("A")), Some(Code::InvalidArgument));
        assert_eq!(
            code(&q("a", &["B", "A"]), Some("A")),
            Some(Code::FailedPrecondition),
            "a loop"
        );
        assert_eq!(code(&q("a", &["a/b"]), Some("a/b")), Some(Code::InvalidArgument));
        let long: Vec<String> = (0..=MAX_PATH).map(|i| format!("s{i}")).collect();
        let mut x = q("a", &[]);
        x.path = long;
        assert_eq!(code(&x, Some("s64")), Some(Code::InvalidArgument));
        let mut x = q("a", &[]);
        x.requirements = None;
        assert_eq!(code(&x, None), Some(Code::InvalidArgument));
        let mut x = q("a", &[]);
        if let Some(r) = x.requirements.as_mut() {
            r.cpus = 0;
        }
        assert!(check(&x, None, "B")
            .err()
            .is_some_and(|e| e.to_string().contains("requirements.cpus")));
        let mut x = q("a", &[]);
        x.deadline_ms = MAX_DEADLINE_MS + 1;
        assert_eq!(code(&x, None), Some(Code::InvalidArgument));
        let mut x = q("a", &[]);
        x.max_results = MAX_RESULTS + 1;
        assert_eq!(code(&x, None), Some(Code::InvalidArgument));
    }

    #[test]
    fn seen_answers_an_id_once_and_stays_bounded() {
        let mut s = Seen::default();
        assert!(s.first("a", 0));
        assert!(!s.first("a", 1));
        assert!(s.first("a", SEEN_NS + 10), "forgotten after the longest deadline");
        for i in 0..(SEEN_CAP * 2) {
            s.first(&format!("q{i}"), SEEN_NS + 20);
        }
        assert!(s.order.len() <= SEEN_CAP && s.ids.len() <= SEEN_CAP);
    }

    fn host(name: &str, total: f64, free: f64, arch: &str) -> Resource {
        let mut r = Resource::unknown(name);
        r.total_cpus = total;
        r.free_cpus = free;
        r.queue_waiting = 0.0;
        r.memory_mb = 4096.0;
        r.arch = arch.into();
        r.updated_ns = 1_000_000_000;
        r
    }

    #[test]
    fn local_matches_need_the_requirements_and_the_cpus_free_now() {
        let snap = Snapshot::new(
            1_100_000_000,
            vec![
                host("a", 8.0, 8.0, "x86_64"),
                host("b", 8.0, 1.0, "x86_64"),
                host("c", 8.0, 8.0, "aarch64"),
                host("d", 1.0, 1.0, "x86_64"),
            ],
        );
        let job = Job {
            name: "q".into(),
            cpus: 2,
            arch: "x86_64".into(),
            reference_time_s: 10.0,
            ..Job::default()
        };
        let got = local_matches(&snap, &job, &RankConfig::default(), "S", "127.0.0.1:1");
        let names: Vec<&str> = got.iter().map(|r| r.host.as_str()).collect();
        assert_eq!(names, ["a"]);
        assert_eq!(
            (got[0].site.as_str(), got[0].endpoint.as_str(), got[0].cpus_free),
            ("S", "127.0.0.1:1", 8)
        );
        // Reserved CPUs are taken off.
        let g = Grid::new("x".into(), 1);
        let mut j = job.clone();
        j.cpus = 7;
        g.book
            .lock()
            .reserve(
                Ask {
                    host: "a".into(),
                    capacity: 8,
                    free_now: Some(8),
                    job: j,
                    exclusive: false,
                    start_s: 0,
                    duration_s: 100,
                    owner: "o".into(),
                },
                1,
            )
            .unwrap();
        let w = g.withhold(snap.clone());
        assert!(local_matches(&w, &job, &RankConfig::default(), "S", "x").is_empty());
        let again = g.withhold(snap);
        assert!(
            Arc::ptr_eq(&w.resources, &again.resources),
            "cached while nothing changes"
        );
    }
}
