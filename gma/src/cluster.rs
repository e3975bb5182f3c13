//! `gma cluster`: status and membership of a replicated directory.

use std::future::Future;

use anyhow::{anyhow, bail};
use gma_proto::raft::raft_client::RaftClient;
use gma_proto::raft::{AddLearnerRequest, AdminReply, ChangeMembershipRequest};
use gma_proto::v1 as pb;

use clap::{Args, Subcommand};

use crate::args::Output;

async fn status_of(addr: &str) -> anyhow::Result<pb::ClusterStatusResponse> {
    let mut c = gma_consumer::directory::client(addr)
        .await
        .map_err(|e| anyhow!("{e}"))?;
    let mut req = tonic::Request::new(pb::ClusterStatusRequest {});
    req.set_timeout(std::time::Duration::from_secs(3));
    Ok(c.cluster_status(req)
        .await
        .map_err(|s| anyhow!("cluster status from {addr}: {}", s.message()))?
        .into_inner())
}

/// The leader's address and the current voters, asked of the first member that knows.
async fn leader(addrs: &str) -> anyhow::Result<(String, Vec<u64>, Vec<u64>)> {
    let mut last = None;
    for addr in addrs.split(',').map(str::trim).filter(|a| !a.is_empty()) {
        match status_of(addr).await {
            Ok(s) => {
                let Some(l) = s.members.iter().find(|m| m.id == s.leader_id) else {
                    last = Some(anyhow!(
                        "{addr} knows no leader (election in progress or no quorum)"
                    ));
                    continue;
                };
                let voters = s.members.iter().filter(|m| m.voter).map(|m| m.id).collect();
                let all = s.members.iter().map(|m| m.id).collect();
                return Ok((l.address.clone(), voters, all));
            }
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| anyhow!("give --directory ADDR[,ADDR...]")))
}

async fn raft_client(addr: &str) -> anyhow::Result<RaftClient<tonic::transport::Channel>> {
    let ch = gma_consumer::connect(addr).await.map_err(|e| anyhow!("{e}"))?;
    Ok(RaftClient::new(ch))
}

pub async fn run(cmd: ClusterCommand) -> anyhow::Result<()> {
    match cmd {
        ClusterCommand::Status { directory, output } => {
            let mut rows = Vec::new();
            let mut errors = Vec::new();
            for addr in directory.split(',').map(str::trim).filter(|a| !a.is_empty()) {
                match status_of(addr).await {
                    Ok(s) => rows.push((addr.to_string(), s)),
                    Err(e) => errors.push(e.to_string()),
                }
            }
            if rows.is_empty() {
                bail!("no member answered: {}", errors.join("; "));
            }
            match output {
                Output::Json => {
                    let v: Vec<serde_json::Value> = rows
                        .iter()
                        .map(|(addr, s)| {
                            serde_json::json!({
                                "asked": addr, "node_id": s.node_id, "state": s.state, "leader_id": s.leader_id,
                                "term": s.term, "last_applied": s.last_applied, "last_log": s.last_log,
                                "revision": s.revision, "producers": s.producers, "consumers": s.consumers,
                                "schemas": s.schemas, "leases": s.leases,
                                "members": s.members.iter().map(|m| serde_json::json!({
                                    "id": m.id, "address": m.address, "voter": m.voter, "leader": m.leader,
                                })).collect::<Vec<_>>(),
                            })
                        })
                        .collect();
                    println!("{}", serde_json::to_string_pretty(&v)?);
                }
                Output::Table => {
                    println!(
                        "{:<22} {:>4} {:<10} {:>6} {:>5} {:>9} {:>9}  MEMBERS",
                        "MEMBER", "ID", "STATE", "LEADER", "TERM", "APPLIED", "REVISION"
                    );
                    for (addr, s) in &rows {
                        let members: Vec<String> = s
                            .members
                            .iter()
                            .map(|m| {
                                format!("{}={}{}", m.id, m.address, if m.voter { "" } else { "(learner)" })
                            })
                            .collect();
                        println!(
                            "{:<22} {:>4} {:<10} {:>6} {:>5} {:>9} {:>9}  {}",
                            addr,
                            s.node_id,
                            s.state,
                            s.leader_id,
                            s.term,
                            s.last_applied,
                            s.revision,
                            members.join(",")
                        );
                    }
                }
            }
            for e in errors {
                eprintln!("warning: {e}");
            }
            Ok(())
        }
        ClusterCommand::AddLearner {
            directory,
            id,
            address,
        } => {
            let (leader, _, _) = leader(&directory).await?;
            admin(&leader, "add-learner", |mut c| async move {
                c.add_learner(AddLearnerRequest { id, address }).await
            })
            .await
        }
        ClusterCommand::Promote { directory, id } => {
            let hint = ": add it with `gma cluster add-learner` first";
            change_voters(&directory, id, hint, |mut voters| {
                if voters.contains(&id) {
                    bail!("node {id} is already a voter");
                }
                voters.push(id);
                Ok(voters)
            })
            .await
        }
        ClusterCommand::Remove { directory, id } => {
            change_voters(&directory, id, "", |voters| {
                let rest: Vec<u64> = voters.into_iter().filter(|v| *v != id).collect();
                if rest.is_empty() {
                    bail!("cannot remove the last voter");
                }
                Ok(rest)
            })
            .await
        }
    }
}

/// Sets the voters of the cluster to `new(voters)` through its leader, once node `id` is known
/// to be a member (`hint` follows the refusal when it is not).
async fn change_voters(
    directory: &str,
    id: u64,
    hint: &str,
    new: impl FnOnce(Vec<u64>) -> anyhow::Result<Vec<u64>>,
) -> anyhow::Result<()> {
    let (leader, voters, all) = leader(directory).await?;
    if !all.contains(&id) {
        bail!("node {id} is not a member{hint}");
    }
    change(&leader, new(voters)?, false).await
}

async fn change(leader: &str, voters: Vec<u64>, retain: bool) -> anyhow::Result<()> {
    admin(leader, "change membership", |mut c| async move {
        c.change_membership(ChangeMembershipRequest { voters, retain })
            .await
    })
    .await
}

/// Makes one membership change at the leader (`what` names it in an error) and prints the
/// leader's reply.
async fn admin<F, Fut>(leader: &str, what: &str, call: F) -> anyhow::Result<()>
where
    F: FnOnce(RaftClient<tonic::transport::Channel>) -> Fut,
    Fut: Future<Output = Result<tonic::Response<AdminReply>, tonic::Status>>,
{
    let r = call(raft_client(leader).await?)
        .await
        .map_err(|s| anyhow!("{what}: {}", s.message()))?
        .into_inner();
    println!("{}", r.message);
    Ok(())
}

#[derive(Args, Debug)]
pub struct ClusterArgs {
    #[command(subcommand)]
    pub command: ClusterCommand,
}

#[derive(Subcommand, Debug)]
pub enum ClusterCommand {
    /// Members, leader, term and applied index, as each listed member sees them.
    Status {
        /// One or more members: ADDR[,ADDR...].
        #[arg(long)]
        directory: String,
        #[arg(long, value_enum, default_value = "table")]
        output: Output,
    },
    /// Add a new member as a learner (it replicates but does not vote yet).
    AddLearner {
        #[arg(long)]
        directory: String,
        /// The new member's node id.
        #[arg(long)]
        id: u64,
        /// The new member's HOST:PORT.
        #[arg(long)]
        address: String,
    },
    /// Make a learner a voter.
    Promote {
        #[arg(long)]
        directory: String,
        #[arg(long)]
        id: u64,
    },
    /// Remove a member from the voters (and from the cluster).
    Remove {
        #[arg(long)]
        directory: String,
        #[arg(long)]
        id: u64,
    },
}
