//! The `Reservations` gRPC service of the Slurm adapter: the same interface as `gma simres`
//! (and the same doors, [`crate::simres::DOORS`]), plus the job RPCs simres refuses.

use gma_core::Refuse;
use std::sync::Arc;

use gma_core::authz::Action;
use gma_core::guard::Gate;
use gma_proto::v1::{self as pb, reservations_server::Reservations};
use tonic::{Request, Response, Status};

use super::manager::SlurmManager;
use crate::error::Error;
use crate::service::RESERVATION_EVENT;
use crate::simres::{caller_owner, RAW_ONLY};

pub struct SlurmService {
    pub manager: Arc<SlurmManager>,
    pub gate: Arc<Gate>,
}

fn bounded(what: &str, s: &str) -> Result<(), Status> {
    if s.len() > 256 {
        return Err(Error::invalid_argument(format!("{what}: at most 256 bytes")).into());
    }
    Ok(())
}

#[tonic::async_trait]
impl Reservations for SlurmService {
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
        bounded("id", &req.get_ref().id)?;
        Ok(Response::new(self.manager.modify(req.get_ref(), &owner).await?))
    }

    async fn release(
        &self,
        req: Request<pb::ReleaseReservationRequest>,
    ) -> Result<Response<pb::ReleaseReservationResponse>, Status> {
        let owner = caller_owner(&self.gate, &req, &req.get_ref().owner)?;
        bounded("id", &req.get_ref().id)?;
        self.manager.release(&req.get_ref().id, &owner).await?;
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
        let r = req.get_ref();
        bounded("reservation_id", &r.reservation_id)?;
        let spec = r
            .job
            .as_ref()
            .ok_or_else(|| Error::invalid_argument("job: give the job to start"))?;
        Ok(Response::new(
            self.manager.claim(&r.reservation_id, &owner, spec).await?,
        ))
    }

    async fn job_status(&self, req: Request<pb::BatchJobRequest>) -> Result<Response<pb::BatchJob>, Status> {
        let owner = caller_owner(&self.gate, &req, &req.get_ref().owner)?;
        bounded("job_id", &req.get_ref().job_id)?;
        Ok(Response::new(self.manager.job(&req.get_ref().job_id, &owner)?))
    }

    async fn cancel_job(&self, req: Request<pb::BatchJobRequest>) -> Result<Response<pb::BatchJob>, Status> {
        let owner = caller_owner(&self.gate, &req, &req.get_ref().owner)?;
        bounded("job_id", &req.get_ref().job_id)?;
        Ok(Response::new(
            self.manager.cancel(&req.get_ref().job_id, &owner).await?,
        ))
    }
}
