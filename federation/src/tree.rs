//! The hierarchy around a running federation endpoint (`gma federation tree`, the dashboard's
//! hierarchy panel), walked with the existing read-only `SiteScheduler.FederationStatus` RPC at
//! every endpoint. Down: each manager's `child` links, recursively (breadth first, one level in
//! parallel); up: its `parent` links, the live one first, until a manager without a superior.
//! Free CPUs per subtree are the manager's own summary plus its inferiors' subtrees as walked;
//! an inferior that does not answer counts with what it last advertised to its superior (its
//! subtree's merged summary, split horizon).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use gma_core::{Refusal, Refuse};
use gma_proto::v1 as pb;
use serde_json::{json, Value};

use crate::error::Error;

/// Levels below the first endpoint walked at most.
pub const MAX_DEPTH: u32 = 32;
/// Endpoints asked at most (bounded work and output).
const MAX_ENDPOINTS: usize = 1000;
/// How long one endpoint may take to answer.
const PER_ENDPOINT: Duration = Duration::from_secs(5);

/// What one endpoint answered: its status, or why not (UNAVAILABLE when it could not be
/// reached or did not answer in time; its own refusal otherwise).
pub type Answers = BTreeMap<String, Result<pb::FederationStatusReply, Refusal>>;

async fn fetch(addr: String) -> (String, Result<pb::FederationStatusReply, Refusal>) {
    let ask = async {
        let ch = gma_consumer::connect(&addr)
            .await
            .map_err(|e| Refusal::unavailable(e.to_string()))?;
        let mut c = pb::site_scheduler_client::SiteSchedulerClient::new(ch)
            .max_decoding_message_size(gma_core::MAX_MESSAGE_BYTES);
        c.federation_status(pb::FederationStatusRequest {})
            .await
            .map(tonic::Response::into_inner)
            .map_err(|s| {
                Refusal::new(
                    s.code(),
                    format!("{} ({:?})", gma_core::tls::explain(&s), s.code()),
                )
            })
    };
    let r = match tokio::time::timeout(PER_ENDPOINT, ask).await {
        Err(_) => Err(Refusal::unavailable(format!("no answer within {PER_ENDPOINT:?}"))),
        Ok(r) => r,
    };
    (addr, r)
}

fn links<'a>(
    r: &'a pb::FederationStatusReply,
    role: &'a str,
) -> impl Iterator<Item = &'a pb::PeerStatus> + 'a {
    r.peers.iter().filter(move |p| p.role == role)
}

/// Asks `root` and every endpoint below it (up to `depth` levels) and its superior chain.
pub async fn collect(root: &str, depth: u32) -> Answers {
    let mut answers = Answers::new();
    let mut level = vec![root.to_string()];
    for d in 0..=depth {
        let mut set = tokio::task::JoinSet::new();
        for a in level.drain(..) {
            if answers.len() + set.len() < MAX_ENDPOINTS && !answers.contains_key(&a) {
                set.spawn(fetch(a));
            }
        }
        let mut next = Vec::new();
        while let Some(j) = set.join_next().await {
            let Ok((addr, r)) = j else { continue };
            if let (Ok(r), true) = (&r, d < depth) {
                next.extend(links(r, "child").map(|p| p.endpoint.clone()));
            }
            answers.insert(addr, r);
        }
        next.retain(|a| !answers.contains_key(a));
        next.sort();
        next.dedup();
        if next.is_empty() {
            break;
        }
        level = next;
    }
    // Up: the live parent first, until a manager without one (or one seen already).
    let mut at = root.to_string();
    for _ in 0..MAX_DEPTH {
        let Some(Ok(r)) = answers.get(&at) else { break };
        let Some(up) = superior(r) else { break };
        let up = up.endpoint.clone();
        if answers.contains_key(&up) {
            break;
        }
        let (addr, r) = fetch(up).await;
        answers.insert(addr.clone(), r);
        at = addr;
    }
    answers
}

/// The superior a manager is attached to: its live parent link, else its first one.
fn superior(r: &pb::FederationStatusReply) -> Option<&pb::PeerStatus> {
    links(r, "parent")
        .find(|p| p.live)
        .or_else(|| links(r, "parent").next())
}

fn own_free(r: &pb::FederationStatusReply) -> u32 {
    r.summary.as_ref().map_or(0, |s| {
        s.classes
            .iter()
            .map(|c| c.cpus_free_sum)
            .fold(0, u32::saturating_add)
    })
}

fn link_json(p: &pb::PeerStatus) -> Value {
    json!({
        "role": p.role, "session": p.session, "live": p.live,
        "heard_ms_ago": (p.heard_ms_ago >= 0).then_some(p.heard_ms_ago),
        "summary_age_ms": (p.summary_age_ms >= 0).then_some(p.summary_age_ms),
        "advertised_cpus_free": p.cpus_free_sum, "last_error": p.last_error,
    })
}

/// One manager and its subtree as JSON: `subtree_cpus_free` is the walked sum, or (for a
/// manager that did not answer) what it advertised over `via`.
fn node(
    addr: &str,
    site: &str,
    via: Option<&pb::PeerStatus>,
    answers: &Answers,
    seen: &mut BTreeSet<String>,
) -> Value {
    let link = via.map(link_json);
    let fresh = seen.insert(addr.to_string());
    match answers.get(addr) {
        Some(Ok(r)) if fresh => {
            let mut inferiors = Vec::new();
            let mut subtree = own_free(r);
            for p in links(r, "child") {
                let n = node(&p.endpoint, &p.site, Some(p), answers, seen);
                subtree = subtree.saturating_add(
                    n["subtree_cpus_free"]
                        .as_u64()
                        .map_or(0, |v| u32::try_from(v).unwrap_or(u32::MAX)),
                );
                inferiors.push(n);
            }
            json!({
                "site": r.site, "endpoint": addr, "epoch": r.epoch, "reachable": true,
                "own_cpus_free": own_free(r), "subtree_cpus_free": subtree,
                "subtree_source": "walked", "link": link, "inferiors": inferiors,
            })
        }
        other => {
            let error = match other {
                Some(Err(e)) => e.to_string(),
                Some(Ok(_)) => "already shown above (a cycle or a second superior)".into(),
                None => "not asked (below --depth or past the endpoint cap)".into(),
            };
            json!({
                "site": site, "endpoint": addr, "reachable": false, "error": error,
                "subtree_cpus_free": via.map_or(0, |p| p.cpus_free_sum),
                "subtree_source": "advertised", "link": link, "inferiors": [],
            })
        }
    }
}

/// The superior chain, nearest first: each with the link health seen from below.
fn chain(root: &str, answers: &Answers) -> Vec<Value> {
    let mut out = Vec::new();
    let mut seen = BTreeSet::from([root.to_string()]);
    let mut at = root.to_string();
    while let Some(Ok(r)) = answers.get(&at) {
        let Some(p) = superior(r) else { break };
        if !seen.insert(p.endpoint.clone()) {
            break;
        }
        let up = answers.get(&p.endpoint);
        out.push(json!({
            "site": p.site, "endpoint": p.endpoint, "below": r.site, "link": link_json(p),
            "reachable": matches!(up, Some(Ok(_))),
            "error": match up { Some(Err(e)) => Some(e.to_string()), _ => None },
        }));
        at = p.endpoint.clone();
    }
    out
}

/// The tree around `root` as JSON: `{"superiors": [...nearest first], "root": node}`.
pub fn tree(root: &str, answers: &Answers) -> Value {
    let mut seen = BTreeSet::new();
    let site = match answers.get(root) {
        Some(Ok(r)) => r.site.clone(),
        _ => String::new(),
    };
    json!({"superiors": chain(root, answers), "root": node(root, &site, None, answers, &mut seen)})
}

/// Walks the tree around `root` (`depth` levels down, at most [`MAX_DEPTH`]) and returns it as
/// [`tree`] does; the error says why `root` itself did not answer (with its code).
pub async fn walk(root: &str, depth: u32) -> Result<Value, Error> {
    let answers = collect(root, depth.min(MAX_DEPTH)).await;
    if let Some(Err(e)) = answers.get(root) {
        let message = format!("federation endpoint {root}: {e}");
        return Err(Refusal::new(e.code(), message).into());
    }
    Ok(tree(root, &answers))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn peer(site: &str, role: &str, live: bool, free: u32) -> pb::PeerStatus {
        pb::PeerStatus {
            site: site.into(),
            endpoint: format!("{site}:1"),
            role: role.into(),
            session: if live { "up" } else { "expired" }.into(),
            live,
            cpus_free_sum: free,
            heard_ms_ago: if live { 50 } else { -1 },
            summary_age_ms: -1,
            ..Default::default()
        }
    }

    fn reply(site: &str, free: u32, peers: Vec<pb::PeerStatus>) -> pb::FederationStatusReply {
        pb::FederationStatusReply {
            site: site.into(),
            epoch: 1,
            peers,
            summary: Some(pb::SiteSummary {
                site: site.into(),
                classes: vec![pb::ResourceClass {
                    cpus_free_sum: free,
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// R above A; A with children A1 (answers) and A2 (down, advertised 7); A1 lists A as its
    /// parent (no walk back up from below).
    fn answers() -> Answers {
        let mut a = Answers::new();
        a.insert(
            "R:1".into(),
            Ok(reply("R", 2, vec![peer("A", "child", true, 20)])),
        );
        a.insert(
            "A:1".into(),
            Ok(reply(
                "A",
                3,
                vec![
                    peer("R", "parent", true, 0),
                    peer("A1", "child", true, 4),
                    peer("A2", "child", false, 7),
                ],
            )),
        );
        a.insert(
            "A1:1".into(),
            Ok(reply("A1", 4, vec![peer("A", "parent", true, 0)])),
        );
        a.insert("A2:1".into(), Err(Refusal::unavailable("connection refused")));
        a
    }

    #[test]
    fn subtrees_sum_walked_and_advertised_free_cpus() {
        let t = tree("A:1", &answers());
        let root = &t["root"];
        assert_eq!(root["site"], "A");
        assert_eq!(root["own_cpus_free"], 3);
        // 3 own + 4 (A1 walked) + 7 (A2 as advertised).
        assert_eq!(root["subtree_cpus_free"], 14);
        let inf = root["inferiors"].as_array().unwrap();
        assert_eq!(inf.len(), 2);
        assert_eq!(inf[0]["subtree_source"], "walked");
        assert_eq!(inf[1]["reachable"], false);
        assert_eq!(inf[1]["subtree_source"], "advertised");
        assert_eq!(inf[1]["link"]["live"], false);
        assert_eq!(inf[1]["error"], "connection refused");
        let sup = t["superiors"].as_array().unwrap();
        assert_eq!(sup.len(), 1);
        assert_eq!(sup[0]["site"], "R");
        assert_eq!(sup[0]["below"], "A");
    }

    #[test]
    fn a_cycle_is_shown_once() {
        let mut a = answers();
        // A1 also claims A as its child: A is not walked twice.
        a.insert(
            "A1:1".into(),
            Ok(reply("A1", 4, vec![peer("A", "child", true, 9)])),
        );
        let t = tree("A:1", &a);
        let a1 = &t["root"]["inferiors"][0];
        assert_eq!(a1["inferiors"][0]["reachable"], false);
        assert_eq!(a1["inferiors"][0]["subtree_source"], "advertised");
    }
}
