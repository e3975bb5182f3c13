//! Resource managers over gRPC: a [`Reserver`] that speaks the `Reservations` service of one
//! or more managers (e.g. `gma simres` processes), routing each request by resource name.

use std::collections::HashMap;
use std::time::Duration;

use gma_proto::v1::{self as pb, reservations_client::ReservationsClient};
use parking_lot::Mutex;
use tonic::transport::Channel;

use crate::reserve::{Answer, ModifyAnswer, Reservation, ReserveError, ReserveRequest, Reserver};

/// Every call to a manager is bounded by this.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// A resource a manager offers for reservation.
#[derive(Debug, Clone, PartialEq)]
pub struct Offered {
    pub name: String,
    pub cpus: u32,
    pub memory_mb: f64,
    pub arch: String,
    /// Index of the manager in [`RemoteReserver::managers`].
    pub manager: usize,
    /// The manager starts jobs in reservations of it (`Claim`).
    pub runs_jobs: bool,
    pub disk_mb: f64,
    pub software: Vec<String>,
}

/// Reservations at one or more managers.
pub struct RemoteReserver {
    managers: Vec<(String, ReservationsClient<Channel>)>,
    by_resource: HashMap<String, usize>,
    offered: Vec<Offered>,
    /// Which manager holds each reservation this reserver created.
    by_id: Mutex<HashMap<String, usize>>,
}

fn unavailable(resource: &str, m: impl std::fmt::Display) -> ReserveError {
    ReserveError::Unavailable {
        resource: resource.to_string(),
        message: m.to_string(),
    }
}

fn status_error(resource: &str, s: tonic::Status) -> ReserveError {
    match s.code() {
        tonic::Code::NotFound => ReserveError::NotFound {
            id: s.message().to_string(),
        },
        tonic::Code::InvalidArgument | tonic::Code::PermissionDenied | tonic::Code::FailedPrecondition => {
            ReserveError::Invalid(s.message().to_string())
        }
        _ => unavailable(resource, format!("{} ({:?})", s.message(), s.code())),
    }
}

pub fn reservation_of(r: pb::Reservation) -> Reservation {
    Reservation {
        id: r.id,
        resource: r.resource,
        cpus: r.cpus,
        start_s: r.start_s,
        end_s: r.end_s,
        owner: r.owner,
    }
}

pub fn reservation_to_proto(r: &Reservation) -> pb::Reservation {
    pb::Reservation {
        id: r.id.clone(),
        resource: r.resource.clone(),
        cpus: r.cpus,
        start_s: r.start_s,
        end_s: r.end_s,
        owner: r.owner.clone(),
        flexible: false,
    }
}

/// The three-way answer of a `ReserveResponse`.
pub fn answer_of(resource: &str, r: pb::ReserveResponse) -> Result<Answer, ReserveError> {
    match pb::ReserveAnswer::try_from(r.answer) {
        Ok(pb::ReserveAnswer::Granted) => r
            .reservation
            .map(|x| Answer::Granted(reservation_of(x)))
            .ok_or_else(|| unavailable(resource, "granted without a reservation")),
        Ok(pb::ReserveAnswer::Never) => Ok(Answer::Never(r.reason)),
        Ok(pb::ReserveAnswer::Retry) => Ok(Answer::Retry {
            from_s: r.retry_from_s,
            reason: r.reason,
        }),
        _ => Err(unavailable(resource, format!("unknown answer {}", r.answer))),
    }
}

/// The `ReserveResponse` of an answer.
pub fn answer_to_proto(a: &Answer, original_released: bool) -> pb::ReserveResponse {
    match a {
        Answer::Granted(r) => pb::ReserveResponse {
            answer: pb::ReserveAnswer::Granted as i32,
            reservation: Some(reservation_to_proto(r)),
            ..Default::default()
        },
        Answer::Never(reason) => pb::ReserveResponse {
            answer: pb::ReserveAnswer::Never as i32,
            reason: reason.clone(),
            original_released,
            ..Default::default()
        },
        Answer::Retry { from_s, reason } => pb::ReserveResponse {
            answer: pb::ReserveAnswer::Retry as i32,
            retry_from_s: *from_s,
            reason: reason.clone(),
            original_released,
            ..Default::default()
        },
    }
}

impl RemoteReserver {
    /// Connects to every manager and asks each for its resources. A resource offered by two
    /// managers goes to the first.
    pub async fn connect(addresses: &[String]) -> Result<RemoteReserver, ReserveError> {
        let mut managers = Vec::new();
        let mut offered = Vec::new();
        let mut by_resource = HashMap::new();
        for addr in addresses {
            let ch = gma_consumer::connect(addr)
                .await
                .map_err(|e| unavailable(addr, e))?;
            let client = ReservationsClient::new(ch).max_decoding_message_size(gma_core::MAX_MESSAGE_BYTES);
            let list = bounded(addr, &client, pb::ResourcesRequest {}, |mut c, m| async move {
                c.resources(m).await
            })
            .await?;
            let idx = managers.len();
            for r in list.resources {
                if by_resource.contains_key(&r.name) {
                    continue;
                }
                by_resource.insert(r.name.clone(), idx);
                offered.push(Offered {
                    name: r.name,
                    cpus: r.cpus,
                    memory_mb: r.memory_mb,
                    arch: r.arch,
                    manager: idx,
                    runs_jobs: r.runs_jobs,
                    disk_mb: r.disk_mb,
                    software: r.software,
                });
            }
            managers.push((addr.clone(), client));
        }
        Ok(RemoteReserver {
            managers,
            by_resource,
            offered,
            by_id: Mutex::new(HashMap::new()),
        })
    }

    pub fn offered(&self) -> &[Offered] {
        &self.offered
    }

    /// The address of manager `i`.
    pub fn manager(&self, i: usize) -> &str {
        self.managers.get(i).map_or("", |m| m.0.as_str())
    }

    /// The address of the manager of `resource`.
    pub fn manager_of(&self, resource: &str) -> Option<&str> {
        self.by_resource.get(resource).map(|i| self.manager(*i))
    }

    /// The client of the manager of `resource` (for the job RPCs).
    pub fn client_of(&self, resource: &str) -> Option<ReservationsClient<Channel>> {
        self.by_resource
            .get(resource)
            .map(|i| self.managers[*i].1.clone())
    }

    fn client_for(&self, resource: &str) -> Result<(usize, ReservationsClient<Channel>), ReserveError> {
        let i = *self
            .by_resource
            .get(resource)
            .ok_or_else(|| ReserveError::Invalid(format!("no manager offers resource {resource:?}")))?;
        Ok((i, self.managers[i].1.clone()))
    }

    fn client_of_id(&self, id: &str) -> Result<ReservationsClient<Channel>, ReserveError> {
        let i = self
            .by_id
            .lock()
            .get(id)
            .copied()
            .ok_or_else(|| ReserveError::NotFound { id: id.to_string() })?;
        Ok(self.managers[i].1.clone())
    }
}

/// One call `call(client, msg)`, bounded by [`CALL_TIMEOUT`]; a manager that rate-limits us
/// (`RESOURCE_EXHAUSTED`) is asked again (with a clone of the client and the message) after a
/// growing pause, within the same bound.
async fn bounded<M, T, F, Fut>(
    resource: &str,
    client: &ReservationsClient<Channel>,
    msg: M,
    call: F,
) -> Result<T, ReserveError>
where
    M: Clone,
    F: Fn(ReservationsClient<Channel>, M) -> Fut,
    Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
{
    let deadline = tokio::time::Instant::now() + CALL_TIMEOUT;
    let mut pause = Duration::from_millis(5);
    loop {
        match tokio::time::timeout_at(deadline, call(client.clone(), msg.clone())).await {
            Err(_) => return Err(unavailable(resource, "timed out")),
            Ok(Ok(r)) => return Ok(r.into_inner()),
            Ok(Err(s))
                if s.code() == tonic::Code::ResourceExhausted
                    && tokio::time::Instant::now() + pause < deadline =>
            {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_millis(500));
            }
            Ok(Err(s)) => return Err(status_error(resource, s)),
        }
    }
}

impl Reserver for RemoteReserver {
    async fn reserve(&self, req: &ReserveRequest) -> Result<Answer, ReserveError> {
        let (i, c) = self.client_for(&req.resource)?;
        let msg = pb::ReserveRequest {
            resource: req.resource.clone(),
            cpus: req.cpus,
            duration_s: req.duration_s,
            earliest_start_s: req.earliest_s,
            latest_start_s: req.latest_s,
            flexible: req.flexible,
            owner: req.owner.clone(),
        };
        let r = bounded(
            &req.resource,
            &c,
            msg,
            |mut c, m| async move { c.reserve(m).await },
        )
        .await?;
        let a = answer_of(&req.resource, r)?;
        if let Answer::Granted(g) = &a {
            self.by_id.lock().insert(g.id.clone(), i);
        }
        Ok(a)
    }

    async fn modify(&self, id: &str, req: &ReserveRequest) -> Result<ModifyAnswer, ReserveError> {
        let c = self.client_of_id(id)?;
        let msg = pb::ModifyReservationRequest {
            id: id.to_string(),
            cpus: req.cpus,
            duration_s: req.duration_s,
            earliest_start_s: req.earliest_s,
            latest_start_s: req.latest_s,
            owner: req.owner.clone(),
        };
        let r = bounded(
            &req.resource,
            &c,
            msg,
            |mut c, m| async move { c.modify(m).await },
        )
        .await?;
        let released = r.original_released;
        let answer = answer_of(&req.resource, r)?;
        if released {
            self.by_id.lock().remove(id);
        }
        Ok(ModifyAnswer {
            answer,
            original_released: released,
        })
    }

    async fn release(&self, id: &str, owner: &str) -> Result<(), ReserveError> {
        let c = self.client_of_id(id)?;
        let msg = pb::ReleaseReservationRequest {
            id: id.to_string(),
            owner: owner.to_string(),
        };
        bounded(id, &c, msg, |mut c, m| async move { c.release(m).await }).await?;
        self.by_id.lock().remove(id);
        Ok(())
    }

    async fn list(&self, resource: &str, owner: &str) -> Result<Vec<Reservation>, ReserveError> {
        let mut out = Vec::new();
        for (i, (addr, c)) in self.managers.iter().enumerate() {
            if !resource.is_empty() && self.by_resource.get(resource) != Some(&i) {
                continue;
            }
            let msg = pb::ListReservationsRequest {
                resource: resource.to_string(),
                owner: owner.to_string(),
                from_s: 0,
                to_s: 0,
            };
            let r = bounded(addr, c, msg, |mut c, m| async move { c.list(m).await }).await?;
            out.extend(r.reservations.into_iter().map(reservation_of));
        }
        Ok(out)
    }
}
