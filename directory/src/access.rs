//! Who may talk to the directory: the authorization policy and limits for the client API, and
//! mutual authentication of raft traffic between members.
//!
//! - Client API: every RPC is charged to the caller's identity (rate limit) and authorized by
//!   the policy: `directory.search` on the event pattern (Search, GetSchema),
//!   `directory.watch` on the event pattern (Watch), `directory.register` on the record id
//!   (Register, Update, Remove). Watch streams count against the per-connection limit. A
//!   member's certificate gets no more than the policy gives its identity: members are not
//!   super-users of the client API.
//! - Raft (AppendEntries, Vote, InstallSnapshot, Forward): when the directory requires client
//!   certificates (`tls.client_ca`), only a peer whose certificate matches a `[[members]]`
//!   entry (CN and O) is served, and AppendEntries, Vote and InstallSnapshot only as a node id
//!   its entry allows; anyone else gets PERMISSION_DENIED. Membership changes (AddLearner,
//!   ChangeMembership) are `admin` actions under the policy.
//! - Speaking for a client: a follower forwards a client's write (raft `Forward`, with the
//!   caller's identity) or linearizable read (the client API, with the caller's identity in the
//!   [`CALLER_CN`]/[`CALLER_ORG`] metadata) to the leader, which authorizes the caller again
//!   under its own policy. The carried identity is trusted only from a verified member; in a
//!   cluster without client certificates nobody is verified and the carried identity is
//!   ignored (the peer's own, anonymous, identity is used).

use gma_core::authz::{Action, Door, Identity};
use gma_core::guard::{load_policy, Gate, Slot};
use gma_core::Refuse;
use tonic::metadata::MetadataValue;
use tonic::Request;

use crate::config::DirectoryConfig;
use crate::error::DirError;
use crate::member::{Member, NodeId};

/// Binary metadata a member sets when it passes a client's read to the leader: the CN and O
/// of the client it speaks for (raw UTF-8).
pub(crate) const CALLER_CN: &str = "gma-caller-cn-bin";
pub(crate) const CALLER_ORG: &str = "gma-caller-org-bin";

/// What a raft door tells anyone but the member whose node id it is.
const RAFT_MEMBER_ONLY: &str = "PERMISSION_DENIED (not a directory member); a member only as a \
                                node id its [[members]] entry allows";

/// The doors of a directory member: the client API (`Directory`) and raft (`Raft`), as the
/// module documentation describes them (docs/security.md).
pub const DOORS: &[Door] = &[
    Door::policy(
        "/gma.v1.Directory/Register",
        &[Action::DirectoryRegister],
        "PERMISSION_DENIED: a summary rule denies directory.register (record ids are not events)",
    ),
    Door::policy(
        "/gma.v1.Directory/Update",
        &[Action::DirectoryRegister],
        "PERMISSION_DENIED: a summary rule denies directory.register",
    ),
    Door::policy(
        "/gma.v1.Directory/Remove",
        &[Action::DirectoryRegister],
        "PERMISSION_DENIED: a summary rule denies directory.register",
    ),
    Door::policy(
        "/gma.v1.Directory/KeepAlive",
        &[Action::DirectoryRegister],
        "each renewal PERMISSION_DENIED unless directory.register is allowed on every record the \
         lease holds",
    ),
    Door::policy(
        "/gma.v1.Directory/Search",
        &[Action::DirectorySearch],
        "served: records and schemas (which producers exist, their event names; no event value)",
    ),
    Door::policy(
        "/gma.v1.Directory/GetSchema",
        &[Action::DirectorySearch],
        "served: the schema (field names and units, no value)",
    ),
    Door::policy(
        "/gma.v1.Directory/Watch",
        &[Action::DirectoryWatch],
        "served: record changes (metadata, no event value); what it may receive is decided by \
         the producers",
    ),
    Door::open(
        "/gma.v1.Directory/Version",
        "served (versions only, no data; rate-limited)",
    ),
    Door::open(
        "/gma.v1.Directory/ClusterStatus",
        "served (members, leader, counts; no record, no data; rate-limited)",
    ),
    Door::members("/gma.raft.v1.Raft/AppendEntries", &[], RAFT_MEMBER_ONLY),
    Door::members("/gma.raft.v1.Raft/Vote", &[], RAFT_MEMBER_ONLY),
    Door::members("/gma.raft.v1.Raft/InstallSnapshot", &[], RAFT_MEMBER_ONLY),
    Door::members(
        "/gma.raft.v1.Raft/Forward",
        &[Action::DirectoryRegister],
        "PERMISSION_DENIED (not a directory member); from a member, the leader authorizes the \
         carried caller again (directory.register)",
    ),
    Door::policy(
        "/gma.raft.v1.Raft/AddLearner",
        &[Action::Admin],
        "PERMISSION_DENIED: admin (cluster.add-learner) is never granted by a summary rule",
    ),
    Door::policy(
        "/gma.raft.v1.Raft/ChangeMembership",
        &[Action::Admin],
        "PERMISSION_DENIED: admin (cluster.change-membership) is never granted by a summary rule",
    ),
];

#[derive(Debug)]
pub(crate) struct Access {
    gate: Gate,
    members: Vec<Member>,
    /// Client certificates are required, so members are recognized by theirs.
    verify_members: bool,
}

impl Access {
    pub fn new(config: &DirectoryConfig) -> Result<Access, DirError> {
        config
            .endpoint
            .limits
            .validate()
            .map_err(|e| DirError::Config(e.to_string()))?;
        let policy = load_policy(config.endpoint.access_policy.as_ref())
            .map_err(|e| DirError::Config(e.to_string()))?;
        Ok(Access {
            gate: Gate::new(policy, config.endpoint.limits.clone()),
            members: config.members.clone(),
            verify_members: config.endpoint.tls.client_ca.is_some(),
        })
    }

    /// Whether `who` (a verified certificate subject) is a configured member.
    pub fn is_member(&self, who: &Identity) -> bool {
        self.verify_members && self.members.iter().any(|m| m.matches(who))
    }

    /// The identity a client-API request acts for, and whether a member passed it on (then
    /// the member already charged it). Only a verified member may speak for another identity.
    fn caller<T>(&self, req: &Request<T>) -> Result<(Identity, bool), DirError> {
        let md = req.metadata();
        let (Some(cn), Some(org)) = (md.get_bin(CALLER_CN), md.get_bin(CALLER_ORG)) else {
            return Ok((gma_core::tls::peer_identity(req), false));
        };
        let peer = gma_core::tls::peer_identity(req);
        if !self.verify_members {
            // Nobody is verified: the claim is ignored.
            return Ok((peer, false));
        }
        if !self.is_member(&peer) {
            return Err(DirError::permission_denied(format!(
                "{peer} is not a directory member and may not speak for another identity; drop the {CALLER_CN} metadata"
            )));
        }
        let text = |v: &MetadataValue<tonic::metadata::Binary>| {
            v.to_bytes()
                .ok()
                .and_then(|b| String::from_utf8(b.to_vec()).ok())
                .ok_or_else(|| DirError::invalid_argument("the caller metadata is not UTF-8"))
        };
        Ok((Identity::new(text(cn)?, text(org)?), true))
    }

    /// Charges the request (unless a member passed it on) and authorizes `action` on
    /// `resource` (empty = `*`) for its caller.
    pub fn check<T>(&self, req: &Request<T>, action: Action, resource: &str) -> Result<Identity, DirError> {
        let (who, passed_on) = self.caller(req)?;
        if !passed_on {
            self.gate.admit(req)?;
        }
        self.gate.authorize(&who, action, &[resource])?;
        Ok(who)
    }

    /// True when the policy may refuse something (a policy is configured).
    pub fn restricts(&self) -> bool {
        !self.gate.policy().allows_everything()
    }

    /// Authorizes without charging (messages of an open stream, forwarded commands).
    pub fn authorize(&self, who: &Identity, action: Action, resource: &str) -> Result<(), DirError> {
        self.gate.authorize(who, action, &[resource])?;
        Ok(())
    }

    /// Charges the request only (rate limit): Version, ClusterStatus, KeepAlive.
    pub fn admit<T>(&self, req: &Request<T>) -> Result<Identity, DirError> {
        Ok(self.gate.admit(req)?)
    }

    /// One Watch stream of the caller's connection.
    pub fn watch_slot<T>(&self, req: &Request<T>) -> Result<Slot, DirError> {
        Ok(self.gate.open_subscription(req)?)
    }

    /// Raft traffic: when certificates are required, only configured members. Returns the
    /// peer's identity.
    pub fn raft_peer<T>(&self, req: &Request<T>) -> Result<Identity, DirError> {
        let who = gma_core::tls::peer_identity(req);
        if !self.verify_members {
            return Ok(who);
        }
        if who.is_anonymous() {
            return Err(DirError::permission_denied(
                "raft traffic is only accepted from directory members presenting a certificate",
            ));
        }
        if !self.is_member(&who) {
            return Err(DirError::permission_denied(format!(
                "{who} is not a directory member (no [[members]] entry matches its CN and O); raft traffic refused"
            )));
        }
        Ok(who)
    }

    /// A raft message from `who` that claims to come from node `node`: the member's entries
    /// must allow that node id (an entry without id allows any).
    pub fn raft_sender(&self, who: &Identity, node: Option<NodeId>) -> Result<(), DirError> {
        if !self.verify_members {
            return Ok(());
        }
        let entries: Vec<&Member> = self.members.iter().filter(|m| m.matches(who)).collect();
        if entries.iter().any(|m| m.id.is_none()) {
            return Ok(());
        }
        let ids: Vec<NodeId> = entries.iter().filter_map(|m| m.id).collect();
        match node {
            Some(n) if ids.contains(&n) => Ok(()),
            _ => Err(DirError::permission_denied(format!(
                "{who} is the directory member with node id {ids:?}, not node {}; raft traffic refused",
                node.map(|n| n.to_string()).unwrap_or_else(|| "unknown".into())
            ))),
        }
    }

    /// The client identity a raft `Forward` carries, trusted only when the peer was verified
    /// as a member ([`Access::raft_peer`]); without client certificates it is ignored.
    pub fn forwarded_caller(&self, caller: Option<gma_proto::raft::Caller>) -> Result<Identity, DirError> {
        let Some(c) = caller else {
            return Err(DirError::invalid_argument(
                "a forwarded command must name the caller it was authorized for (a member of an older version?); upgrade every member",
            ));
        };
        if !self.verify_members {
            return Ok(Identity::anonymous());
        }
        Ok(Identity::new(c.cn, c.org))
    }

    /// Membership changes: `admin` under the policy.
    pub fn admin<T>(&self, req: &Request<T>, op: &str) -> Result<(), DirError> {
        self.check(req, Action::Admin, op).map(|_| ())
    }
}

/// Sets the metadata through which a member speaks for `who` on a read it passes on.
pub(crate) fn speak_for<T>(req: &mut Request<T>, who: &Identity) {
    let md = req.metadata_mut();
    md.insert_bin(CALLER_CN, MetadataValue::from_bytes(who.cn.as_bytes()));
    md.insert_bin(CALLER_ORG, MetadataValue::from_bytes(who.org.as_bytes()));
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Status;

    fn config(members: &str) -> DirectoryConfig {
        let mut c: DirectoryConfig =
            gma_core::config::parse_toml(&format!("data_dir = \"/tmp/x\"\n{members}"), "t").unwrap();
        c.endpoint.tls.client_ca = Some("ca.pem".into());
        c
    }

    #[test]
    fn members_match_cn_and_org_and_bind_node_ids() {
        let a = Access::new(&config(
            "[[members]]\nid = 2\ncn = \"dir-2\"\norg = \"grid\"\n[[members]]\ncn = \"dir-x*\"\norg = \"grid\"\n",
        ))
        .unwrap();
        let two = Identity::new("dir-2", "grid");
        assert!(a.is_member(&two));
        assert!(!a.is_member(&Identity::new("dir-2", "partner")));
        assert!(!a.is_member(&Identity::new("dir-evil", "grid")));
        assert!(!a.is_member(&Identity::anonymous()));
        a.raft_sender(&two, Some(2)).unwrap();
        let e = Status::from(a.raft_sender(&two, Some(3)).unwrap_err());
        assert_eq!(e.code(), tonic::Code::PermissionDenied);
        assert!(e.message().contains("not node 3"), "{}", e.message());
        // An entry without id: any node.
        a.raft_sender(&Identity::new("dir-x9", "grid"), Some(9)).unwrap();
    }

    #[test]
    fn only_members_speak_for_others() {
        let a = Access::new(&config("[[members]]\ncn = \"dir-*\"\norg = \"grid\"\n")).unwrap();
        let mut req = Request::new(());
        speak_for(&mut req, &Identity::new("alice", "site1"));
        // No certificate on the request: anonymous, not a member.
        let e = Status::from(a.caller(&req).unwrap_err());
        assert_eq!(e.code(), tonic::Code::PermissionDenied);
        assert!(e.message().contains("may not speak for"), "{}", e.message());
        // Without verified members the claim is ignored.
        let open = Access::new(&DirectoryConfig::new("/tmp/x")).unwrap();
        assert_eq!(open.caller(&req).unwrap(), (Identity::anonymous(), false));
        assert_eq!(
            open.forwarded_caller(Some(gma_proto::raft::Caller {
                cn: "alice".into(),
                org: "site1".into()
            }))
            .unwrap(),
            Identity::anonymous()
        );
        assert_eq!(
            Status::from(a.forwarded_caller(None).unwrap_err()).code(),
            tonic::Code::InvalidArgument
        );
    }
}
