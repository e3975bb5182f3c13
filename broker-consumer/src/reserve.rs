//! The advance-reservation interface as the coallocator sees it (the `Reservations` gRPC
//! service of a resource manager, or an in-memory calendar in tests and replays).
//!
//! A request asks for `cpus` on one resource for `duration_s`, starting anywhere in the
//! window `[earliest_s, latest_s]`. The three-way answer of the paper (§2.3): granted, never
//! possible, or not in this window but perhaps from `t_next` on. Times are integer seconds on
//! one clock (Unix seconds on the wire; replays may use any origin).

use std::future::Future;

use gma_proto::v1 as pb;

/// A start-time window request for one resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReserveRequest {
    pub resource: String,
    pub cpus: u32,
    pub duration_s: i64,
    pub earliest_s: i64,
    pub latest_s: i64,
    pub flexible: bool,
    pub owner: String,
}

impl ReserveRequest {
    /// A `Reserve` as it arrives at a resource manager, for `owner` (the caller's name).
    pub fn from_reserve(r: &pb::ReserveRequest, owner: &str) -> ReserveRequest {
        ReserveRequest {
            resource: r.resource.clone(),
            cpus: r.cpus,
            duration_s: r.duration_s,
            earliest_s: r.earliest_start_s,
            latest_s: r.latest_start_s,
            flexible: r.flexible,
            owner: owner.to_string(),
        }
    }

    /// A `Modify` as it arrives at a resource manager: the new window of a reservation held on
    /// `resource`, for `owner`; a modify is never flexible.
    pub fn from_modify(r: &pb::ModifyReservationRequest, resource: &str, owner: &str) -> ReserveRequest {
        ReserveRequest {
            resource: resource.to_string(),
            cpus: r.cpus,
            duration_s: r.duration_s,
            earliest_s: r.earliest_start_s,
            latest_s: r.latest_start_s,
            flexible: false,
            owner: owner.to_string(),
        }
    }
}

/// A held reservation: `cpus` of `resource` over `[start_s, end_s)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reservation {
    pub id: String,
    pub resource: String,
    pub cpus: u32,
    pub start_s: i64,
    pub end_s: i64,
    pub owner: String,
}

/// The resource manager's answer to a create or modify.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    Granted(Reservation),
    /// Can never be granted (more CPUs than the resource has, past its horizon, policy).
    Never(String),
    /// Not in the requested window; a request starting at `from_s` or later may be granted.
    Retry {
        from_s: i64,
        reason: String,
    },
}

impl Answer {
    pub fn granted(&self) -> Option<&Reservation> {
        match self {
            Answer::Granted(r) => Some(r),
            _ => None,
        }
    }
}

/// The answer to a modify: when not granted, whether the original reservation is gone (a
/// manager whose modify is release + create, as Maui's, can lose it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModifyAnswer {
    pub answer: Answer,
    pub original_released: bool,
}

/// A failure to talk to the resource manager (not a refusal: refusals are [`Answer`]s).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReserveError {
    #[error("reservation manager for {resource:?} unreachable: {message}")]
    Unavailable { resource: String, message: String },
    #[error("reservation {id:?} not found")]
    NotFound { id: String },
    #[error("invalid reservation request: {0}")]
    Invalid(String),
}

/// What the coallocator needs from resource managers.
pub trait Reserver: Send + Sync {
    /// Creates a reservation starting in `[earliest_s, latest_s]` (the earliest possible start).
    fn reserve(&self, req: &ReserveRequest) -> impl Future<Output = Result<Answer, ReserveError>> + Send;
    /// Reshapes held reservation `id` (same resource) to `req`; the id stays the same.
    fn modify(
        &self,
        id: &str,
        req: &ReserveRequest,
    ) -> impl Future<Output = Result<ModifyAnswer, ReserveError>> + Send;
    /// Releases held reservation `id` (releasing an unknown id is `NotFound`).
    fn release(&self, id: &str, owner: &str) -> impl Future<Output = Result<(), ReserveError>> + Send;
    /// Reservations held on `resource` ("" = all) by `owner` ("" = anyone).
    fn list(
        &self,
        resource: &str,
        owner: &str,
    ) -> impl Future<Output = Result<Vec<Reservation>, ReserveError>> + Send;
}
