//! The Slurm adapter's side of the `Reservations` gRPC service: the same interface as
//! `gma simres` (one service, [`crate::simres::ReservationService`], with the same doors,
//! [`crate::simres::DOORS`]), plus the job RPCs simres refuses.

use gma_core::Refuse;
use gma_proto::v1 as pb;

use super::manager::SlurmManager;
use crate::error::Error;
use crate::simres::{bounded, ResourceManager};

#[tonic::async_trait]
impl ResourceManager for SlurmManager {
    fn resources(&self) -> Vec<pb::ReservableResource> {
        SlurmManager::resources(self)
    }

    async fn reserve(&self, req: &pb::ReserveRequest, owner: &str) -> Result<pb::ReserveResponse, Error> {
        SlurmManager::reserve(self, req, owner).await
    }

    async fn modify(
        &self,
        req: &pb::ModifyReservationRequest,
        owner: &str,
    ) -> Result<pb::ReserveResponse, Error> {
        bounded("id", &req.id)?;
        SlurmManager::modify(self, req, owner).await
    }

    async fn release(&self, req: &pb::ReleaseReservationRequest, owner: &str) -> Result<(), Error> {
        bounded("id", &req.id)?;
        SlurmManager::release(self, &req.id, owner).await
    }

    fn list(&self, req: &pb::ListReservationsRequest) -> Vec<pb::Reservation> {
        SlurmManager::list(self, req)
    }

    async fn claim(&self, req: &pb::ClaimRequest, owner: &str) -> Result<pb::BatchJob, Error> {
        bounded("reservation_id", &req.reservation_id)?;
        let spec = req
            .job
            .as_ref()
            .ok_or_else(|| Error::invalid_argument("job: give the job to start"))?;
        SlurmManager::claim(self, &req.reservation_id, owner, spec).await
    }

    async fn job_status(&self, req: &pb::BatchJobRequest, owner: &str) -> Result<pb::BatchJob, Error> {
        bounded("job_id", &req.job_id)?;
        self.job(&req.job_id, owner)
    }

    async fn cancel_job(&self, req: &pb::BatchJobRequest, owner: &str) -> Result<pb::BatchJob, Error> {
        bounded("job_id", &req.job_id)?;
        self.cancel(&req.job_id, owner).await
    }
}
