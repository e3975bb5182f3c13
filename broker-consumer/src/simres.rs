//! `gma simres`: a simulated resource manager with per-resource reservation calendars, serving
//! the `Reservations` interface (create / modify / release / list, with the three-way answer
//! granted / never / retry-from) so the broker's reservations and coallocation run for real.
//!
//! It is also a producer: every change is published as a `reservation.state` event (state
//! `granted`, `modified`, `claimed`, `released`, `expired`, with the reservation), so what a coallocation
//! held at any moment can be checked on the stream, and the broker finds resource managers in
//! the directory as the producers of `reservation.state`. A claimed reservation gets a
//! simulated job (crate::simjobs: it starts exactly at the reserved start, runs nothing, and is
//! published as `job.batch`), so a coallocated set can be started across simres and Slurm.
//!
//! ```toml
//! listen = "127.0.0.1:7400"     # optional (flag --listen wins)
//! directory = "127.0.0.1:7000"  # optional: register (as a producer of reservation.state)
//! source = "simres"             # source of the events (default simres)
//! horizon_s = 0                 # reservations must end within this many seconds of now (0: none)
//! non_atomic_modify = false     # modify = release + create (Maui): a refused one loses the original
//! [[resource]]
//! name = "hostA"                # unique
//! cpus = 8                      # >= 1
//! memory_mb = 16384             # optional
//! arch = "x86_64"               # optional
//! [[resource.background]]       # held by owner "background" from startup
//! start_in_s = 600              # from startup
//! duration_s = 1200
//! cpus = 8                      # default: the whole resource
//! slot_s = 3600                 # rm.slots: free time is offered in slots of at most this
//! [prices]                      # rm.slots: service units per processor-hour (default 1)
//! hostA = 2.0
//! [random_background]           # optional: `count` blocks per resource, placed uniformly
//! count = 1                     # within [now, now + within_s - duration_s]
//! duration_s = 1200
//! within_s = 14400
//! seed = 1
//! ```

use gma_core::Refuse;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use gma_core::authz::{Action, Door};
use gma_core::event::{dbl, schema, text, EventData};
use gma_core::guard::Gate;
use gma_core::time::now_ns;
use gma_producer::{Hub, Identity, Producer};
use gma_proto::v1::{self as pb, reservations_server::Reservations};
use parking_lot::Mutex;
use rand::{Rng, SeedableRng};
use serde::Deserialize;
use tokio::net::TcpListener;
use tonic::{Request, Response, Status};

use crate::calendar::{Calendar, Calendars};
use crate::error::Error;
use crate::remote::{answer_to_proto, reservation_to_proto};
use crate::reserve::{Answer, Reservation, ReserveRequest};
use crate::service::RESERVATION_EVENT;
use crate::simjobs::{job_schema, publish_job, ClaimRefused, SimJobs};

/// Owner of the reservations a simulation starts with.
pub const BACKGROUND_OWNER: &str = "background";
/// Longest reservation accepted, and farthest start (`gma simres` and `gma slurm` alike).
pub(crate) const MAX_SPAN_S: i64 = 366 * 86_400;
/// Reservations that ended this long ago are dropped (and published as `expired`).
const EXPIRE_AFTER_S: i64 = 60;

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Background {
    pub start_in_s: i64,
    pub duration_s: i64,
    pub cpus: Option<u32>,
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ResourceSpec {
    pub name: String,
    pub cpus: u32,
    #[serde(default)]
    pub memory_mb: f64,
    #[serde(default)]
    pub arch: String,
    #[serde(default)]
    pub background: Vec<Background>,
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RandomBackground {
    pub count: u32,
    pub duration_s: i64,
    pub within_s: i64,
    #[serde(default)]
    pub seed: u64,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SimresConfig {
    pub listen: Option<String>,
    /// The registration keys of the manager's record ([`gma_core::registration::Registration`]):
    /// `directory` (none = not registered), `id`, `advertise`, `site`, `org`, `lease_ttl_ms`.
    #[serde(flatten)]
    pub registration: gma_core::registration::Registration,
    pub source: String,
    pub horizon_s: i64,
    pub non_atomic_modify: bool,
    #[serde(rename = "resource")]
    pub resources: Vec<ResourceSpec>,
    pub random_background: Option<RandomBackground>,
    /// `rm.slots`: free time is offered in slots of at most this many seconds.
    pub slot_s: i64,
    /// `rm.slots`: price per resource, service units per processor-hour (default 1).
    pub prices: std::collections::HashMap<String, f64>,
    /// The shared endpoint keys (`[tls]`, `access_policy`, `[limits]`, `metrics_listen`,
    /// `rpc_events_ms`): see [`gma_core::endpoint::Endpoint`].
    #[serde(flatten)]
    pub endpoint: gma_core::endpoint::Endpoint,
}

impl Default for SimresConfig {
    fn default() -> Self {
        SimresConfig {
            listen: None,
            registration: Default::default(),
            source: "simres".into(),
            horizon_s: 0,
            non_atomic_modify: false,
            resources: Vec::new(),
            random_background: None,
            slot_s: 3600,
            prices: Default::default(),
            endpoint: Default::default(),
        }
    }
}

impl SimresConfig {
    /// Checks every field; the message names the first bad one.
    pub fn validate(&self) -> Result<(), Error> {
        let bad = |m: String| Err(Error::Simres(m));
        if self.resources.is_empty() {
            return bad("resource: give at least one [[resource]] table".into());
        }
        if self.resources.len() > 100_000 {
            return bad("resource: at most 100000 resources".into());
        }
        if !(0..=MAX_SPAN_S).contains(&self.horizon_s) {
            return bad(format!(
                "horizon_s: must be within 0..={MAX_SPAN_S} (0 = no horizon)"
            ));
        }
        gma_core::pattern::validate_source(&self.source)
            .map_err(|e| Error::Simres(format!("source: {e}")))?;
        if !(1..=MAX_SPAN_S).contains(&self.slot_s) {
            return bad(format!("slot_s: must be within 1..={MAX_SPAN_S}"));
        }
        for (name, price) in &self.prices {
            if !self.resources.iter().any(|r| r.name == *name) {
                return bad(format!("prices.{name}: no such resource"));
            }
            if !(price.is_finite() && *price >= 0.0) {
                return bad(format!("prices.{name}: must be a finite number >= 0"));
            }
        }
        let mut names = std::collections::HashSet::new();
        for (i, r) in self.resources.iter().enumerate() {
            let at = format!("resource[{i}]");
            gma_core::pattern::validate_source(&r.name)
                .map_err(|e| Error::Simres(format!("{at}.name: {e}")))?;
            if !names.insert(r.name.as_str()) {
                return bad(format!("{at}.name: {:?} is used twice", r.name));
            }
            if r.cpus == 0 {
                return bad(format!("{at}.cpus: must be at least 1"));
            }
            if !r.memory_mb.is_finite() || r.memory_mb < 0.0 {
                return bad(format!("{at}.memory_mb: must be a finite number >= 0"));
            }
            for (k, b) in r.background.iter().enumerate() {
                let at = format!("{at}.background[{k}]");
                if !(0..=MAX_SPAN_S).contains(&b.start_in_s) {
                    return bad(format!("{at}.start_in_s: must be within 0..={MAX_SPAN_S}"));
                }
                if !(1..=MAX_SPAN_S).contains(&b.duration_s) {
                    return bad(format!("{at}.duration_s: must be within 1..={MAX_SPAN_S}"));
                }
                if b.cpus.is_some_and(|c| c == 0 || c > r.cpus) {
                    return bad(format!("{at}.cpus: must be within 1..={}", r.cpus));
                }
            }
        }
        if let Some(rb) = &self.random_background {
            if rb.count > 1000 {
                return bad("random_background.count: at most 1000".into());
            }
            if !(1..=MAX_SPAN_S).contains(&rb.duration_s) {
                return bad(format!(
                    "random_background.duration_s: must be within 1..={MAX_SPAN_S}"
                ));
            }
            if rb.within_s < rb.duration_s || rb.within_s > MAX_SPAN_S {
                return bad("random_background.within_s: must be at least duration_s".into());
            }
        }
        Ok(())
    }
}

/// `rm.slots`: the free capacity a manager offers, as slots (Singh et al.; docs/provisioning.md).
pub const SLOTS_EVENT: &str = crate::provision::offers::SLOTS_EVENT;
/// How far ahead slots are offered when the manager has no horizon.
const OFFER_HORIZON_S: i64 = 86_400;

/// `rm.slots`: one event per slot of a snapshot; a snapshot's events share its version.
pub fn slots_schema() -> pb::EventSchema {
    schema(
        SLOTS_EVENT,
        "the free slots a resource manager offers: one event per slot, a snapshot's events share its version; an empty snapshot is one event with count 0",
        vec![
            dbl("start_s", "s", "slot start, Unix seconds"),
            dbl("end_s", "s", "slot end (exclusive), Unix seconds"),
            dbl("processors", "cpus", "processors free over the whole slot"),
            dbl("price", "SU/cpu-h", "service units per processor-hour"),
            dbl("version", "", "snapshot number, increasing"),
            dbl("count", "", "slots in this snapshot"),
            text("resource", "the resource"),
            text("slot", "slot id"),
        ],
    )
}

/// `reservation.state`: every change of a reservation.
pub fn reservation_schema() -> pb::EventSchema {
    schema(
        RESERVATION_EVENT,
        "an advance reservation at a resource manager changed",
        vec![
            dbl("start_s", "s", "reserved start, Unix seconds"),
            dbl("end_s", "s", "reserved end (exclusive), Unix seconds"),
            dbl("cpus", "cpus", "reserved CPUs"),
            text("id", "reservation id"),
            text("resource", "the resource reserved"),
            text("owner", "who holds it"),
            text("state", "granted, modified, released or expired"),
        ],
    )
}

/// Publishes a `reservation.state` event (`gma simres` and `gma slurm` alike); nothing without
/// a hub, a warning when the hub refuses it.
pub(crate) fn publish_reservation(hub: Option<&Hub>, source: &str, r: &Reservation, state: &str) {
    let Some(hub) = hub else { return };
    let e = EventData {
        name: RESERVATION_EVENT.into(),
        source: source.to_string(),
        timestamp_ns: now_ns(),
        numbers: vec![r.start_s as f64, r.end_s as f64, f64::from(r.cpus)],
        strings: vec![r.id.clone(), r.resource.clone(), r.owner.clone(), state.into()],
    };
    if let (_, Err(err)) = hub.publish(&[e]) {
        tracing::warn!(error = %err, "cannot publish reservation.state");
    }
}

/// Checks the numbers of a window request (`gma simres` and `gma slurm` alike): at least one
/// CPU, a duration of at most [`MAX_SPAN_S`], a window that is not reversed and does not start
/// more than that ahead of `now_s`. INVALID_ARGUMENT naming the field.
pub(crate) fn check_window(r: &ReserveRequest, now_s: i64) -> Result<(), Error> {
    if r.cpus == 0 {
        return Err(invalid("cpus: must be at least 1"));
    }
    if !(1..=MAX_SPAN_S).contains(&r.duration_s) {
        return Err(invalid(format!("duration_s: must be within 1..={MAX_SPAN_S}")));
    }
    if r.earliest_s > r.latest_s {
        return Err(invalid("earliest_start_s: must not be after latest_start_s"));
    }
    if r.latest_s > now_s + MAX_SPAN_S {
        return Err(invalid("latest_start_s: at most a year ahead"));
    }
    Ok(())
}

/// The manager's state behind the gRPC service.
pub struct Manager {
    calendars: Mutex<Calendars>,
    resources: Vec<pb::ReservableResource>,
    horizon_s: i64,
    /// Prepended to calendar ids on the wire, so ids of two managers (or of two runs of one)
    /// never collide.
    prefix: String,
    hub: Option<Arc<Hub>>,
    source: String,
    /// The jobs claimed into reservations (simulated: crate::simjobs).
    jobs: Mutex<SimJobs>,
    /// Per resource (as `resources`): its price for `rm.slots`.
    prices: Vec<f64>,
    slot_s: i64,
    slots_version: std::sync::atomic::AtomicU64,
}

fn invalid(m: impl Into<String>) -> Error {
    Error::invalid_argument(m.into())
}

impl Manager {
    /// Builds the calendars (with the background reservations placed relative to `now_s`).
    pub fn new(config: &SimresConfig, now_s: i64, hub: Option<Arc<Hub>>) -> Result<Manager, Error> {
        config.validate()?;
        let mut cals = Calendars::new();
        for r in &config.resources {
            cals.insert(
                Calendar::new(r.name.clone(), r.cpus).with_non_atomic_modify(config.non_atomic_modify),
            );
        }
        let mut rng =
            rand_chacha::ChaCha8Rng::seed_from_u64(config.random_background.as_ref().map_or(0, |b| b.seed));
        for r in &config.resources {
            let mut blocks: Vec<(i64, i64, u32)> = r
                .background
                .iter()
                .map(|b| (now_s + b.start_in_s, b.duration_s, b.cpus.unwrap_or(r.cpus)))
                .collect();
            if let Some(rb) = &config.random_background {
                for _ in 0..rb.count {
                    let start = now_s + rng.random_range(0..=rb.within_s - rb.duration_s);
                    blocks.push((start, rb.duration_s, r.cpus));
                }
            }
            for (start, duration_s, cpus) in blocks {
                let a = cals.reserve(&ReserveRequest {
                    resource: r.name.clone(),
                    cpus,
                    duration_s,
                    earliest_s: start,
                    latest_s: start,
                    flexible: false,
                    owner: BACKGROUND_OWNER.into(),
                });
                if a.granted().is_none() {
                    // Overlapping background blocks: the later one waits for room, never lost.
                    let a = cals.reserve(&ReserveRequest {
                        resource: r.name.clone(),
                        cpus,
                        duration_s,
                        earliest_s: start,
                        latest_s: start + MAX_SPAN_S,
                        flexible: false,
                        owner: BACKGROUND_OWNER.into(),
                    });
                    if a.granted().is_none() {
                        return Err(Error::Simres(format!(
                            "resource {:?}: cannot place its background reservations",
                            r.name
                        )));
                    }
                }
            }
        }
        let prefix = format!("{:08x}-", rng.random::<u32>() ^ (now_ns() as u32));
        Ok(Manager {
            calendars: Mutex::new(cals),
            resources: config
                .resources
                .iter()
                .map(|r| pb::ReservableResource {
                    name: r.name.clone(),
                    cpus: r.cpus,
                    memory_mb: r.memory_mb,
                    arch: r.arch.clone(),
                    horizon_s: config.horizon_s,
                    ..Default::default()
                })
                .collect(),
            horizon_s: config.horizon_s,
            prefix,
            hub,
            source: config.source.clone(),
            jobs: Mutex::new(SimJobs::default()),
            prices: config
                .resources
                .iter()
                .map(|r| config.prices.get(&r.name).copied().unwrap_or(1.0))
                .collect(),
            slot_s: config.slot_s,
            slots_version: std::sync::atomic::AtomicU64::new(0),
        })
    }

    fn wire(&self, mut r: Reservation) -> Reservation {
        r.id = format!("{}{}", self.prefix, r.id);
        r
    }

    pub(crate) fn local_id<'a>(&self, id: &'a str) -> Result<&'a str, Error> {
        id.strip_prefix(&self.prefix)
            .ok_or_else(|| Error::not_found(format!("reservation {:?} not found", gma_core::clip(id, 64))))
    }

    fn publish(&self, r: &Reservation, state: &str) {
        publish_reservation(self.hub.as_deref(), &self.source, r, state);
        self.publish_slots();
    }

    /// Publishes the free slots now (`rm.slots`), a new snapshot.
    pub fn publish_slots(&self) {
        let Some(hub) = self.hub.as_deref() else { return };
        let events = self.slot_events(now_ns() / 1_000_000_000);
        if let (_, Err(err)) = hub.publish(&events) {
            tracing::warn!(error = %err, "cannot publish rm.slots");
        }
    }

    /// The `rm.slots` snapshot at `now_s`: every resource's free processors from now to the
    /// horizon (24 h when the manager has none), cut at every reservation boundary and every
    /// `slot_s` (`provision::free`), at most 4096 slots, the earliest resources first.
    pub fn slot_events(&self, now_s: i64) -> Vec<EventData> {
        use crate::provision::free::{free_slots, Capacity};
        let mut held: std::collections::HashMap<String, Vec<(i64, i64, u32)>> = Default::default();
        for r in self.list(&pb::ListReservationsRequest {
            from_s: now_s,
            ..Default::default()
        }) {
            held.entry(r.resource)
                .or_default()
                .push((r.start_s, r.end_s, r.cpus));
        }
        let horizon = if self.horizon_s > 0 {
            self.horizon_s
        } else {
            OFFER_HORIZON_S
        };
        let caps: Vec<Capacity> = self
            .resources
            .iter()
            .zip(&self.prices)
            .map(|(r, &price)| Capacity {
                resource: r.name.clone(),
                cpus: r.cpus,
                until_s: now_s + horizon,
                reserved: held.remove(&r.name).unwrap_or_default(),
                price,
            })
            .collect();
        let slots = free_slots(now_s, self.slot_s, &caps);
        let version = self
            .slots_version
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            + 1;
        crate::provision::offers::snapshot_events(&self.source, now_ns(), version, slots)
    }

    /// Checks a window request and applies the clock (no start in the past) and the horizon:
    /// the request with its window so narrowed, or the answer NEVER.
    fn checked(&self, r: ReserveRequest, now_s: i64) -> Result<Result<ReserveRequest, Answer>, Error> {
        check_window(&r, now_s)?;
        let (resource, duration_s, latest) = (r.resource.as_str(), r.duration_s, r.latest_s);
        if !self.resources.iter().any(|x| x.name == resource) {
            return Ok(Err(Answer::Never(format!(
                "unknown resource {:?}",
                gma_core::clip(resource, 64)
            ))));
        }
        if latest < now_s {
            return Ok(Err(Answer::Never("the start window is in the past".into())));
        }
        let earliest = r.earliest_s.max(now_s);
        if self.horizon_s > 0 && earliest + duration_s > now_s + self.horizon_s {
            return Ok(Err(Answer::Never(format!(
                "would end past the manager's horizon ({} s from now)",
                self.horizon_s
            ))));
        }
        Ok(Ok(ReserveRequest {
            earliest_s: earliest,
            ..r
        }))
    }

    /// Turns an answer that reaches past the horizon into NEVER (and drops such a grant).
    fn within_horizon(
        &self,
        cals: &mut Calendars,
        a: Answer,
        duration_s: i64,
        owner: &str,
        now_s: i64,
    ) -> Answer {
        if self.horizon_s == 0 {
            return a;
        }
        let limit = now_s + self.horizon_s;
        match a {
            Answer::Granted(r) if r.end_s > limit => {
                let _ = cals.release(&r.id, owner);
                Answer::Never("no room before the manager's horizon".into())
            }
            Answer::Retry { from_s, .. } if from_s + duration_s > limit => {
                Answer::Never("no room before the manager's horizon".into())
            }
            other => other,
        }
    }

    pub fn reserve(&self, req: &pb::ReserveRequest, owner: &str) -> Result<pb::ReserveResponse, Error> {
        let now_s = now_ns() / 1_000_000_000;
        let r = match self.checked(ReserveRequest::from_reserve(req, owner), now_s)? {
            Ok(r) => r,
            Err(a) => return Ok(answer_to_proto(&a, false)),
        };
        let answer = {
            let mut cals = self.calendars.lock();
            let a = cals.reserve(&r);
            self.within_horizon(&mut cals, a, req.duration_s, owner, now_s)
        };
        let answer = match answer {
            Answer::Granted(g) => {
                let g = self.wire(g);
                self.publish(&g, "granted");
                metrics::counter!("gma_simres_reservations_total", "answer" => "granted").increment(1);
                Answer::Granted(g)
            }
            other => {
                metrics::counter!("gma_simres_reservations_total", "answer" => "refused").increment(1);
                other
            }
        };
        Ok(answer_to_proto(&answer, false))
    }

    pub fn modify(
        &self,
        req: &pb::ModifyReservationRequest,
        owner: &str,
    ) -> Result<pb::ReserveResponse, Error> {
        let now_s = now_ns() / 1_000_000_000;
        let local = self.local_id(&req.id)?;
        let holder = {
            let cals = self.calendars.lock();
            let found = cals.iter().find(|c| c.holds(local)).map(|c| c.name().to_string());
            found
        };
        let resource = holder.ok_or_else(|| {
            Error::not_found(format!("reservation {:?} not found", gma_core::clip(&req.id, 64)))
        })?;
        let r = match self.checked(ReserveRequest::from_modify(req, &resource, owner), now_s)? {
            Ok(r) => r,
            Err(a) => return Ok(answer_to_proto(&a, false)),
        };
        let (out, released) = {
            let mut cals = self.calendars.lock();
            let before = cals.list(&resource, "").into_iter().find(|x| x.id == local);
            let m = cals.modify(local, &r)?;
            match m.answer {
                Answer::Granted(g) if self.horizon_s > 0 && g.end_s > now_s + self.horizon_s => {
                    // Past the horizon: put the original back (atomic) or drop it (non-atomic).
                    let restored = before.and_then(|b| {
                        cals.modify(
                            local,
                            &ReserveRequest {
                                resource: resource.clone(),
                                cpus: b.cpus,
                                duration_s: b.end_s - b.start_s,
                                earliest_s: b.start_s,
                                latest_s: b.start_s,
                                flexible: false,
                                owner: owner.to_string(),
                            },
                        )
                        .ok()
                        .and_then(|m| m.answer.granted().cloned())
                    });
                    if restored.is_none() {
                        let _ = cals.release(local, owner);
                    }
                    (
                        Answer::Never("no room before the manager's horizon".into()),
                        restored.is_none(),
                    )
                }
                a => (a, m.original_released),
            }
        };
        let out = match out {
            Answer::Granted(g) => {
                let g = self.wire(g);
                self.publish(&g, "modified");
                Answer::Granted(g)
            }
            other => other,
        };
        if released {
            self.publish(
                &Reservation {
                    id: req.id.clone(),
                    resource,
                    cpus: 0,
                    start_s: 0,
                    end_s: 0,
                    owner: owner.to_string(),
                },
                "released",
            );
        }
        Ok(answer_to_proto(&out, released))
    }

    /// Releases a reservation; a job claimed into it is cancelled first.
    pub fn release(&self, id: &str, owner: &str) -> Result<(), Error> {
        let local = self.local_id(id)?;
        let r = self.calendars.lock().release(local, owner)?;
        let cancelled = {
            let mut jobs = self.jobs.lock();
            jobs.of_reservation(id).and_then(|j| {
                jobs.cancel(
                    &j,
                    now_ns() / 1_000_000_000,
                    "cancelled: its reservation was released",
                )
            })
        };
        if let Some((j, cpus)) = cancelled {
            publish_job(self.hub.as_deref(), &self.source, &j, cpus);
        }
        self.publish(&self.wire(r), "released");
        Ok(())
    }

    /// The held reservation `id` of `owner` (NOT_FOUND / PERMISSION_DENIED as for a claim).
    fn held_by(&self, id: &str, owner: &str) -> Result<Reservation, Error> {
        let local = self.local_id(id)?;
        let held = self
            .calendars
            .lock()
            .list("", "")
            .into_iter()
            .find(|r| r.id == local);
        owned_by(
            held,
            |r| r.owner.as_str(),
            "reservation",
            id,
            owner,
            ": only its creator may claim it",
        )
        .map(|r| self.wire(r))
    }

    /// Claims reservation `id` with a simulated job (crate::simjobs): pending until the
    /// reservation's start, running from it, completed at its end. The script is not run.
    pub fn claim(&self, id: &str, owner: &str, spec: &pb::BatchJobSpec) -> Result<pb::BatchJob, Error> {
        let res = self.held_by(id, owner)?;
        let now = now_ns() / 1_000_000_000;
        let job = self
            .jobs
            .lock()
            .claim(&res, owner, spec, now)
            .map_err(|e| match e {
                ClaimRefused::Cpus(..) | ClaimRefused::Name => invalid(e.to_string()),
                _ => Error::failed_precondition(e.to_string()),
            })?;
        self.publish(&res, "claimed");
        publish_job(self.hub.as_deref(), &self.source, &job, spec.cpus);
        // A reservation that has already started starts its job at once.
        self.advance_jobs(now);
        Ok(self.jobs.lock().get(&job.job_id).cloned().unwrap_or(job))
    }

    /// Moves the simulated jobs to `now_s`: publishes their changes and releases the
    /// reservations of the jobs that ended.
    pub fn advance_jobs(&self, now_s: i64) {
        let (changed, ended) = self.jobs.lock().advance(now_s);
        for (j, cpus) in &changed {
            publish_job(self.hub.as_deref(), &self.source, j, *cpus);
        }
        for id in ended {
            let Ok(local) = self.local_id(&id) else { continue };
            let owner = self
                .calendars
                .lock()
                .list("", "")
                .into_iter()
                .find(|r| r.id == local)
                .map(|r| r.owner);
            if let Some(owner) = owner {
                if let Ok(r) = self.calendars.lock().release(local, &owner) {
                    self.publish(&self.wire(r), "released");
                }
            }
        }
    }

    fn owned_job(&self, job_id: &str, owner: &str) -> Result<pb::BatchJob, Error> {
        self.advance_jobs(now_ns() / 1_000_000_000);
        let jobs = self.jobs.lock();
        owned_by(jobs.get(job_id), |j| j.owner.as_str(), "job", job_id, owner, "").cloned()
    }

    pub fn list(&self, req: &pb::ListReservationsRequest) -> Vec<pb::Reservation> {
        let cals = self.calendars.lock();
        cals.list(&req.resource, &req.owner)
            .into_iter()
            .filter(|r| req.from_s == 0 || r.end_s > req.from_s)
            .filter(|r| req.to_s == 0 || r.start_s < req.to_s)
            .map(|r| reservation_to_proto(&self.wire(r)))
            .collect()
    }

    /// Drops reservations that ended a while ago (published as `expired`).
    pub fn expire(&self, now_s: i64) -> usize {
        let gone: Vec<Reservation> = {
            let mut cals = self.calendars.lock();
            let old: Vec<Reservation> = cals
                .list("", "")
                .into_iter()
                .filter(|r| r.end_s + EXPIRE_AFTER_S < now_s)
                .collect();
            old.into_iter()
                .filter_map(|r| cals.release(&r.id, &r.owner).ok())
                .collect()
        };
        for r in &gone {
            self.publish(&self.wire(r.clone()), "expired");
        }
        gone.len()
    }
}

/// The `admin` operation that lets a certified caller reserve for another owner (a broker
/// coallocating for its caller).
pub const ON_BEHALF: &str = "reservation.on-behalf";

/// The way out named to a summary-only identity: reservations have no summaries.
pub(crate) const RAW_ONLY: &str = "reservations have no summaries: an allow grant of reservation is needed";

/// The doors of the `Reservations` service (`gma simres`): `reservation` on
/// `reservation.state`, allowed outright (a summary grant serves nothing: the calendars are the
/// raw contents of `reservation.state`).
pub const DOORS: &[Door] = &[
    Door::policy(
        "/gma.v1.Reservations/Resources",
        &[Action::Reserve],
        "PERMISSION_DENIED naming the rule (reservation needs an allow grant)",
    ),
    Door::policy(
        "/gma.v1.Reservations/Reserve",
        &[Action::Reserve],
        "PERMISSION_DENIED naming the rule (reservation needs an allow grant)",
    ),
    Door::policy(
        "/gma.v1.Reservations/Modify",
        &[Action::Reserve],
        "PERMISSION_DENIED naming the rule (reservation needs an allow grant)",
    ),
    Door::policy(
        "/gma.v1.Reservations/Release",
        &[Action::Reserve],
        "PERMISSION_DENIED naming the rule (reservation needs an allow grant)",
    ),
    Door::policy(
        "/gma.v1.Reservations/Claim",
        &[Action::Reserve],
        "PERMISSION_DENIED naming the rule (reservation needs an allow grant); only the \
         reservation's creator may claim it",
    ),
    Door::policy(
        "/gma.v1.Reservations/JobStatus",
        &[Action::Reserve],
        "PERMISSION_DENIED naming the rule (reservation needs an allow grant); only the job's \
         owner sees it",
    ),
    Door::policy(
        "/gma.v1.Reservations/CancelJob",
        &[Action::Reserve],
        "PERMISSION_DENIED naming the rule (reservation needs an allow grant); only the job's \
         owner may cancel it",
    ),
    Door::policy(
        "/gma.v1.Reservations/List",
        &[Action::Reserve],
        "PERMISSION_DENIED naming the rule: the list is the raw calendars (reservation needs an \
         allow grant)",
    ),
];

/// A resource manager behind the `Reservations` service: [`Manager`] (`gma simres`) and
/// [`crate::slurm::SlurmManager`] (`gma slurm`). The service checks the caller (the doors,
/// [`caller_owner`]); the manager checks the rest of the request and answers.
#[tonic::async_trait]
pub trait ResourceManager: Send + Sync + 'static {
    /// What `Resources` answers.
    fn resources(&self) -> Vec<pb::ReservableResource>;
    async fn reserve(&self, req: &pb::ReserveRequest, owner: &str) -> Result<pb::ReserveResponse, Error>;
    async fn modify(
        &self,
        req: &pb::ModifyReservationRequest,
        owner: &str,
    ) -> Result<pb::ReserveResponse, Error>;
    async fn release(&self, req: &pb::ReleaseReservationRequest, owner: &str) -> Result<(), Error>;
    /// The reservations `req` selects (its `resource` and `owner` are at most 256 bytes).
    fn list(&self, req: &pb::ListReservationsRequest) -> Vec<pb::Reservation>;
    async fn claim(&self, req: &pb::ClaimRequest, owner: &str) -> Result<pb::BatchJob, Error>;
    async fn job_status(&self, req: &pb::BatchJobRequest, owner: &str) -> Result<pb::BatchJob, Error>;
    async fn cancel_job(&self, req: &pb::BatchJobRequest, owner: &str) -> Result<pb::BatchJob, Error>;
}

/// The `Reservations` gRPC service of a [`ResourceManager`].
pub struct ReservationService<M> {
    pub manager: Arc<M>,
    pub gate: Arc<Gate>,
}

/// `found` (the `kind` named `id`) when `owner` holds it (`holder`): NOT_FOUND when there is
/// none, PERMISSION_DENIED naming its holder (then `rule`) when it is another's.
pub(crate) fn owned_by<T>(
    found: Option<T>,
    holder: impl Fn(&T) -> &str,
    kind: &str,
    id: &str,
    owner: &str,
    rule: &str,
) -> Result<T, Error> {
    let id = gma_core::clip(id, 64);
    let item = found.ok_or_else(|| Error::not_found(format!("{kind} {id:?} not found")))?;
    let held_by = holder(&item);
    if held_by != owner {
        return Err(Error::permission_denied(format!(
            "{kind} {id:?} belongs to {held_by:?}, not {owner:?}{rule}"
        )));
    }
    Ok(item)
}

/// INVALID_ARGUMENT when `s` is longer than 256 bytes.
pub(crate) fn bounded(what: &str, s: &str) -> Result<(), Error> {
    if s.len() > 256 {
        return Err(invalid(format!("{what}: at most 256 bytes")));
    }
    Ok(())
}

/// The owner of a reservation request (`gma simres` and `gma slurm` alike): the certificate's
/// CN when the peer has one, else the `owner` field (or "anonymous"). A certified caller
/// naming another owner (the broker reserving for its caller) needs `admin` on [`ON_BEHALF`]
/// allowed; else it is refused.
pub fn caller_owner<T>(gate: &Gate, req: &Request<T>, claimed: &str) -> Result<String, Error> {
    let who = gate.check_raw(req, Action::Reserve, &[RESERVATION_EVENT], RAW_ONLY)?;
    if claimed.len() > 256 {
        return Err(invalid("owner: at most 256 bytes"));
    }
    if !who.cn.is_empty() {
        if !claimed.is_empty() && claimed != who.cn {
            if gate.raw_allowed(&who, Action::Admin, ON_BEHALF) {
                return Ok(claimed.to_string());
            }
            return Err(Error::permission_denied(format!(
                "owner {:?} is not the caller ({who}): reserving for another owner needs admin on {ON_BEHALF:?}",
                gma_core::clip(claimed, 64),
            )));
        }
        return Ok(who.cn);
    }
    Ok(if claimed.is_empty() {
        "anonymous".into()
    } else {
        claimed.to_string()
    })
}

#[tonic::async_trait]
impl<M: ResourceManager> Reservations for ReservationService<M> {
    async fn resources(
        &self,
        req: Request<pb::ResourcesRequest>,
    ) -> Result<Response<pb::ResourcesResponse>, Status> {
        self.gate
            .check_raw(&req, Action::Reserve, &[RESERVATION_EVENT], RAW_ONLY)?;
        Ok(Response::new(pb::ResourcesResponse {
            resources: self.manager.resources(),
        }))
    }

    async fn reserve(
        &self,
        req: Request<pb::ReserveRequest>,
    ) -> Result<Response<pb::ReserveResponse>, Status> {
        let owner = caller_owner(&self.gate, &req, &req.get_ref().owner)?;
        Ok(Response::new(self.manager.reserve(req.get_ref(), &owner).await?))
    }

    async fn modify(
        &self,
        req: Request<pb::ModifyReservationRequest>,
    ) -> Result<Response<pb::ReserveResponse>, Status> {
        let owner = caller_owner(&self.gate, &req, &req.get_ref().owner)?;
        Ok(Response::new(self.manager.modify(req.get_ref(), &owner).await?))
    }

    async fn release(
        &self,
        req: Request<pb::ReleaseReservationRequest>,
    ) -> Result<Response<pb::ReleaseReservationResponse>, Status> {
        let owner = caller_owner(&self.gate, &req, &req.get_ref().owner)?;
        self.manager.release(req.get_ref(), &owner).await?;
        Ok(Response::new(pb::ReleaseReservationResponse { released: true }))
    }

    async fn list(
        &self,
        req: Request<pb::ListReservationsRequest>,
    ) -> Result<Response<pb::ListReservationsResponse>, Status> {
        self.gate
            .check_raw(&req, Action::Reserve, &[RESERVATION_EVENT], RAW_ONLY)?;
        bounded("resource", &req.get_ref().resource)?;
        bounded("owner", &req.get_ref().owner)?;
        Ok(Response::new(pb::ListReservationsResponse {
            reservations: self.manager.list(req.get_ref()),
        }))
    }

    async fn claim(&self, req: Request<pb::ClaimRequest>) -> Result<Response<pb::BatchJob>, Status> {
        let owner = caller_owner(&self.gate, &req, &req.get_ref().owner)?;
        Ok(Response::new(self.manager.claim(req.get_ref(), &owner).await?))
    }

    async fn job_status(&self, req: Request<pb::BatchJobRequest>) -> Result<Response<pb::BatchJob>, Status> {
        let owner = caller_owner(&self.gate, &req, &req.get_ref().owner)?;
        Ok(Response::new(
            self.manager.job_status(req.get_ref(), &owner).await?,
        ))
    }

    async fn cancel_job(&self, req: Request<pb::BatchJobRequest>) -> Result<Response<pb::BatchJob>, Status> {
        let owner = caller_owner(&self.gate, &req, &req.get_ref().owner)?;
        Ok(Response::new(
            self.manager.cancel_job(req.get_ref(), &owner).await?,
        ))
    }
}

#[tonic::async_trait]
impl ResourceManager for Manager {
    fn resources(&self) -> Vec<pb::ReservableResource> {
        self.resources.clone()
    }

    async fn reserve(&self, req: &pb::ReserveRequest, owner: &str) -> Result<pb::ReserveResponse, Error> {
        Manager::reserve(self, req, owner)
    }

    async fn modify(
        &self,
        req: &pb::ModifyReservationRequest,
        owner: &str,
    ) -> Result<pb::ReserveResponse, Error> {
        Manager::modify(self, req, owner)
    }

    async fn release(&self, req: &pb::ReleaseReservationRequest, owner: &str) -> Result<(), Error> {
        Manager::release(self, &req.id, owner)
    }

    fn list(&self, req: &pb::ListReservationsRequest) -> Vec<pb::Reservation> {
        Manager::list(self, req)
    }

    async fn claim(&self, req: &pb::ClaimRequest, owner: &str) -> Result<pb::BatchJob, Error> {
        let spec = req
            .job
            .as_ref()
            .ok_or_else(|| invalid("job: give the job to start"))?;
        Manager::claim(self, &req.reservation_id, owner, spec)
    }

    async fn job_status(&self, req: &pb::BatchJobRequest, owner: &str) -> Result<pb::BatchJob, Error> {
        bounded("job_id", &req.job_id)?;
        self.owned_job(&req.job_id, owner)
    }

    async fn cancel_job(&self, req: &pb::BatchJobRequest, owner: &str) -> Result<pb::BatchJob, Error> {
        bounded("job_id", &req.job_id)?;
        let j = self.owned_job(&req.job_id, owner)?;
        let now = now_ns() / 1_000_000_000;
        let cancelled = self.jobs.lock().cancel(&j.job_id, now, "cancelled by its owner");
        let Some((j, cpus)) = cancelled else { return Ok(j) };
        publish_job(self.hub.as_deref(), &self.source, &j, cpus);
        // The reservation ends with its job (as at gma slurm).
        if let Ok(local) = self.local_id(&j.reservation_id) {
            if let Ok(r) = self.calendars.lock().release(local, &j.owner) {
                self.publish(&self.wire(r), "released");
            }
        }
        Ok(j)
    }
}

/// The producer a resource manager (`role`: simres, slurm) runs in: a producer of `schemas`
/// and nobody's archive (`who.push` is turned off: its events are pulled by who wants them).
pub(crate) fn manager_producer(
    role: &str,
    endpoint: &gma_core::endpoint::Endpoint,
    who: Identity,
    schemas: &[pb::EventSchema],
) -> Result<Producer, gma_producer::ProducerError> {
    Producer::embedded(role, endpoint, Identity { push: false, ..who }, schemas)
}

/// Serves `manager`'s `Reservations` service, beside the producer's own, until `shutdown`.
pub(crate) async fn serve<M: ResourceManager>(
    producer: Producer,
    manager: Arc<M>,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), gma_producer::ProducerError> {
    let service = ReservationService {
        manager,
        gate: producer.gate.clone(),
    };
    producer
        .run_with(listener, shutdown, move |services| {
            services.add_service(
                pb::reservations_server::ReservationsServer::new(service)
                    .max_decoding_message_size(gma_core::MAX_MESSAGE_BYTES),
            )
        })
        .await
}

/// Runs the simulated resource manager until `shutdown`.
pub async fn run(
    config: SimresConfig,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    let producer = manager_producer(
        "simres",
        &config.endpoint,
        Identity::new(&config.source, config.registration.clone()),
        &[reservation_schema(), job_schema(), slots_schema()],
    )
    .map_err(|e| Error::Simres(e.to_string()))?;
    let manager = Arc::new(Manager::new(
        &config,
        now_ns() / 1_000_000_000,
        Some(producer.hub.clone()),
    )?);
    for r in manager.list(&pb::ListReservationsRequest::default()) {
        let r = crate::remote::reservation_of(r);
        manager.publish(&r, "granted");
    }
    manager.publish_slots();
    let expirer = {
        let m = manager.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(10));
            loop {
                tick.tick().await;
                m.expire(now_ns() / 1_000_000_000);
            }
        })
    };
    // Simulated jobs start and end on the clock (crate::simjobs).
    let runner = {
        let m = manager.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(200));
            loop {
                tick.tick().await;
                m.advance_jobs(now_ns() / 1_000_000_000);
            }
        })
    };
    let r = serve(producer, manager, listener, shutdown).await;
    expirer.abort();
    runner.abort();
    r.map_err(|e| Error::Simres(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(text: &str) -> SimresConfig {
        gma_core::config::parse_toml(text, "simres.toml").unwrap()
    }

    const NOW: i64 = 1_800_000_000;

    #[test]
    fn bad_configs_name_the_field() {
        for (text, want) in [
            ("", "resource: give at least one"),
            ("[[resource]]\nname = \"a\"\ncpus = 0\n", "resource[0].cpus"),
            ("[[resource]]\nname = \"a\"\ncpus = 1\n[[resource]]\nname = \"a\"\ncpus = 1\n", "resource[1].name"),
            ("[[resource]]\nname = \"a\"\ncpus = 1\n[[resource.background]]\nstart_in_s = 0\nduration_s = 0\n", "resource[0].background[0].duration_s"),
            ("horizon_s = -1\n[[resource]]\nname = \"a\"\ncpus = 1\n", "horizon_s"),
        ] {
            let e = config(text).validate().unwrap_err().to_string();
            assert!(e.contains(want), "{text:?}: {e}");
        }
        let e = gma_core::config::parse_toml::<SimresConfig>("[[resource]]\nname = \"a\"\ncpu = 1\n", "s")
            .unwrap_err();
        assert!(e.to_string().contains("unknown field `cpu`"), "{e}");
    }

    #[test]
    fn free_slots_are_offered_around_reservations_in_versioned_snapshots() {
        let cfg = config(
            "slot_s = 3600\n[prices]\nm = 2.5\n[[resource]]\nname = \"m\"\ncpus = 4\n\
             [[resource.background]]\nstart_in_s = 100\nduration_s = 50\n",
        );
        let m = Manager::new(&cfg, NOW, None).unwrap();
        let slots = |evs: &[EventData]| -> Vec<(i64, i64, u32)> {
            evs.iter()
                .map(|e| {
                    (
                        e.numbers[0] as i64 - NOW,
                        e.numbers[1] as i64 - NOW,
                        e.numbers[2] as u32,
                    )
                })
                .collect()
        };
        let a = m.slot_events(NOW);
        // Free until the background block, then hour-long slots to the 24-hour horizon.
        assert_eq!(slots(&a)[..3], [(0, 100, 4), (150, 3600, 4), (3600, 7200, 4)]);
        assert_eq!(a.len(), 2 + 23);
        assert!(a
            .iter()
            .all(|e| e.name == SLOTS_EVENT && e.numbers[3] == 2.5 && e.numbers[4] == 1.0));
        assert!(a.iter().all(|e| e.numbers[5] == 25.0 && e.strings[0] == "m"));
        // A reservation of 3 CPUs splits the slot it falls in; the version moves on.
        let base = NOW + 200;
        let mut cals = m.calendars.lock();
        let g = cals.reserve(&ReserveRequest {
            resource: "m".into(),
            cpus: 3,
            duration_s: 100,
            earliest_s: base,
            latest_s: base,
            flexible: false,
            owner: "u".into(),
        });
        assert!(g.granted().is_some());
        drop(cals);
        let b = m.slot_events(NOW);
        assert_eq!(
            slots(&b)[..4],
            [(0, 100, 4), (150, 200, 4), (200, 300, 1), (300, 3600, 4)]
        );
        assert!(b.iter().all(|e| e.numbers[4] == 2.0));
        // Nothing free at all: one event saying so.
        let full = config(
            "[[resource]]\nname = \"m\"\ncpus = 1\nbackground = [{ start_in_s = 0, duration_s = 90000 }]\n",
        );
        let e = Manager::new(&full, NOW, None).unwrap().slot_events(NOW);
        assert_eq!((e.len(), e[0].numbers[5]), (1, 0.0));
        let bad = config("[prices]\nzz = 1\n[[resource]]\nname = \"m\"\ncpus = 1\n");
        assert!(bad
            .validate()
            .unwrap_err()
            .to_string()
            .contains("prices.zz: no such resource"));
    }

    #[test]
    fn background_blocks_windows_and_the_three_answers() {
        let cfg = config(
            "[[resource]]\nname = \"m\"\ncpus = 4\n[[resource.background]]\nstart_in_s = 100\nduration_s = 50\n",
        );
        let m = Manager::new(&cfg, NOW, None).unwrap();
        let req = |cpus, dur, e, l| pb::ReserveRequest {
            resource: "m".into(),
            cpus,
            duration_s: dur,
            earliest_start_s: e,
            latest_start_s: l,
            ..Default::default()
        };
        // A real clock is used for "now": test against far-future windows.
        let base = now_ns() / 1_000_000_000 + 1_000_000;
        let a = m.reserve(&req(5, 10, base, base), "u").unwrap();
        assert_eq!(
            a.answer,
            pb::ReserveAnswer::Never as i32,
            "more CPUs than the resource has"
        );
        let a = m.reserve(&req(4, 10, base, base + 5), "u").unwrap();
        assert_eq!(a.answer, pb::ReserveAnswer::Granted as i32);
        let g = a.reservation.unwrap();
        assert!(g.id.starts_with(&m.prefix));
        let b = m.reserve(&req(1, 10, base, base + 5), "v").unwrap();
        assert_eq!(b.answer, pb::ReserveAnswer::Retry as i32);
        assert_eq!(b.retry_from_s, base + 10);
        // Only the holder may release.
        assert_eq!(
            Status::from(m.release(&g.id, "v").unwrap_err()).code(),
            tonic::Code::PermissionDenied
        );
        m.release(&g.id, "u").unwrap();
        assert_eq!(
            Status::from(m.release(&g.id, "u").unwrap_err()).code(),
            tonic::Code::NotFound
        );
        assert_eq!(
            Status::from(m.release("nonsense", "u").unwrap_err()).code(),
            tonic::Code::NotFound
        );
        // In the past: never.
        let p = m.reserve(&req(1, 10, 10, 20), "u").unwrap();
        assert_eq!(p.answer, pb::ReserveAnswer::Never as i32);
        // Bad input is INVALID_ARGUMENT, not an answer.
        assert_eq!(
            Status::from(m.reserve(&req(1, 0, base, base), "u").unwrap_err()).code(),
            tonic::Code::InvalidArgument
        );
        assert_eq!(
            Status::from(m.reserve(&req(1, 5, base + 1, base), "u").unwrap_err()).code(),
            tonic::Code::InvalidArgument
        );
        let l = m.list(&pb::ListReservationsRequest::default());
        assert_eq!(l.len(), 1, "the background block only: {l:?}");
        assert_eq!(l[0].owner, BACKGROUND_OWNER);
    }

    #[test]
    fn the_horizon_turns_late_answers_into_never() {
        let now = now_ns() / 1_000_000_000;
        let cfg = config("horizon_s = 3600\n[[resource]]\nname = \"m\"\ncpus = 1\n[[resource.background]]\nstart_in_s = 1000\nduration_s = 2000\n");
        let m = Manager::new(&cfg, now, None).unwrap();
        let req = |dur, e, l| pb::ReserveRequest {
            resource: "m".into(),
            cpus: 1,
            duration_s: dur,
            earliest_start_s: e,
            latest_start_s: l,
            ..Default::default()
        };
        // Fits before the block.
        assert_eq!(
            m.reserve(&req(600, now + 10, now + 20), "u").unwrap().answer,
            pb::ReserveAnswer::Granted as i32
        );
        // After the block it would end past the horizon ...
        assert_eq!(
            m.reserve(&req(700, now + 900, now + 950), "u").unwrap().answer,
            pb::ReserveAnswer::Never as i32
        );
        // ... while one that would end exactly at the horizon may retry.
        assert_eq!(
            m.reserve(&req(600, now + 900, now + 950), "u").unwrap().answer,
            pb::ReserveAnswer::Retry as i32
        );
        assert_eq!(
            m.reserve(&req(7200, now + 10, now + 20), "u").unwrap().answer,
            pb::ReserveAnswer::Never as i32
        );
    }

    #[test]
    fn random_background_is_deterministic_per_seed() {
        let text = "[random_background]\ncount = 2\nduration_s = 1200\nwithin_s = 14400\nseed = 5\n[[resource]]\nname = \"a\"\ncpus = 1\n[[resource]]\nname = \"b\"\ncpus = 1\n";
        let starts = |m: &Manager| {
            m.list(&pb::ListReservationsRequest::default())
                .into_iter()
                .map(|r| (r.resource, r.start_s))
                .collect::<Vec<_>>()
        };
        let a = Manager::new(&config(text), NOW, None).unwrap();
        let b = Manager::new(&config(text), NOW, None).unwrap();
        assert_eq!(starts(&a), starts(&b));
        assert_eq!(starts(&a).len(), 4);
        assert!(starts(&a).iter().all(|(_, s)| *s >= NOW && *s <= NOW + 14400));
    }

    /// The wire contract: field names, types and units, in order.
    #[test]
    fn reservation_schema_is_pinned() {
        assert_eq!(
            gma_core::event::signature(&reservation_schema()),
            "reservation.state v1: start_s double s, end_s double s, cpus double cpus, id string, resource string, owner string, state string"
        );
    }
}
