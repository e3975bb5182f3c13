//! Who may talk to the directory: the authorization policy and limits for the client API, and
//! mutual authentication of raft traffic between members.
//!
//! - Client API: every RPC is charged to the caller's identity (rate limit) and authorized by
//!   the policy: `directory.search` on the event pattern (Search, GetSchema),
//!   `directory.watch` on the event pattern (Watch), `directory.register` on the record id
//!   (Register, Update, Remove). Watch streams count against the per-connection limit.
//! - Raft (AppendEntries, Vote, InstallSnapshot, Forward): when the directory requires client
//!   certificates (`tls.client_ca`), only a peer with a certificate — and, when `member_cn` is
//!   set, one whose CN matches it — is served; anyone else gets PERMISSION_DENIED. Membership
//!   changes (AddLearner, ChangeMembership) are `admin` actions under the policy.
//! - Members (identities matching `member_cn`) pass the client API's policy: a follower forwards
//!   linearizable reads to the leader under its own identity, after authorizing the client.

use gma_core::authz::{name_glob, Action, Identity};
use gma_core::guard::{load_policy, Gate, Slot};
use tonic::{Request, Status};

use crate::error::DirError;
use crate::server::DirectoryConfig;

#[derive(Debug)]
pub(crate) struct Access {
    gate: Gate,
    member_cn: Option<String>,
    members_need_certs: bool,
}

impl Access {
    pub fn new(config: &DirectoryConfig) -> Result<Access, DirError> {
        config.limits.validate().map_err(DirError::Config)?;
        let policy = load_policy(config.policy.as_ref()).map_err(DirError::Config)?;
        Ok(Access {
            gate: Gate::new(policy, config.limits.clone()),
            member_cn: config.member_cn.clone().filter(|m| !m.is_empty()),
            members_need_certs: config.tls.client_ca.is_some(),
        })
    }

    fn is_member(&self, who: &Identity) -> bool {
        !who.is_anonymous() && self.member_cn.as_deref().is_some_and(|g| name_glob(g, &who.cn))
    }

    /// Charges the request and authorizes `action` on `resource` (empty = `*`).
    pub fn check<T>(&self, req: &Request<T>, action: Action, resource: &str) -> Result<Identity, Status> {
        let who = self.gate.admit(req)?;
        if !self.is_member(&who) {
            self.gate.authorize(&who, action, &[resource])?;
        }
        Ok(who)
    }

    /// True when the policy may refuse `who` something (a policy is configured and `who` is
    /// not a member).
    pub fn restricts(&self, who: &Identity) -> bool {
        !self.is_member(who) && !self.gate.policy().allows_everything()
    }

    /// Authorizes without charging (messages of an open stream).
    pub fn authorize(&self, who: &Identity, action: Action, resource: &str) -> Result<(), Status> {
        if !self.is_member(who) {
            self.gate.authorize(who, action, &[resource])?;
        }
        Ok(())
    }

    /// Charges the request only (rate limit): Version, ClusterStatus, KeepAlive.
    pub fn admit<T>(&self, req: &Request<T>) -> Result<Identity, Status> {
        self.gate.admit(req)
    }

    /// One Watch stream of the caller's connection.
    pub fn watch_slot<T>(&self, req: &Request<T>) -> Result<Slot, Status> {
        self.gate.open_subscription(req)
    }

    /// Raft traffic: only members when certificates are required.
    pub fn raft_peer<T>(&self, req: &Request<T>) -> Result<(), Status> {
        if !self.members_need_certs {
            return Ok(());
        }
        let who = gma_core::tls::peer_identity(req);
        if who.is_anonymous() {
            return Err(Status::permission_denied(
                "raft traffic is only accepted from directory members presenting a certificate",
            ));
        }
        if let Some(g) = &self.member_cn {
            if !name_glob(g, &who.cn) {
                return Err(Status::permission_denied(format!(
                    "{who} is not a directory member (member_cn = {g:?}); raft traffic refused"
                )));
            }
        }
        Ok(())
    }

    /// Membership changes: members, or `admin` under the policy.
    pub fn admin<T>(&self, req: &Request<T>, op: &str) -> Result<(), Status> {
        self.check(req, Action::Admin, op).map(|_| ())
    }
}
