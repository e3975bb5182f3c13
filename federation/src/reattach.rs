//! Automatic re-attachment: when every superior (parent link) of a site has been silent for
//! `reattach_after_ms`, the site attaches to the next superior of its chain: the configured
//! `[[superior]]` entries, then what its parents told it of their own superiors (the
//! grandparent first). A parent tells its inferiors its superiors on the session they opened
//! with it (a `Superiors` frame on Exchange; the directory of each comes from that superior's
//! Welcome), and the site keeps the list in its state file, so a site configured with only its
//! parent re-attaches to its grandparent when the parent dies.
//!
//! Health is the session itself: a parent is live while its heartbeats and replies arrive
//! within the session timeout (`heartbeat_ms` × `session_misses`); nothing else is probed.
//! Attaching itself uses the paths of `gma federation add|remove`:
//!
//! 1. the site registers itself as a **child** link record in the superior's directory (the
//!    superior's endpoint adopts it like any `gma federation add --role child`, so the
//!    directory's access policy decides whether the site may: write access to link records);
//! 2. it registers the superior as a **parent** link in its own directory;
//! 3. it removes the silent parents' links from its own directory.
//!
//! The endpoint persists its links (and the removed ones) in its state file, so a restart keeps
//! the result. Removing a silent parent's link settles this site's jobs there
//! (`SiteState::link_gone`): not yet granted, back to the queue; granted, reported failed
//! (outcome unknown), never run again. A forward is accepted once per global job id.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

pub use crate::config::{Superior, DEFAULT_AFTER_MS};
use crate::links;
use crate::site::{Link, Role};

/// What the watcher needs from the running endpoint (implemented by `service::Shared`).
pub trait Watched: Send + Sync + 'static {
    fn config(&self) -> &crate::config::FederationConfig;
    fn site(&self) -> &str;
    fn now(&self) -> i64;
    /// This site's parent links: (site, live).
    fn parents(self: &Arc<Self>) -> Vec<(String, bool)>;
    /// The chain now: configured, then told by the parents.
    fn chain(self: &Arc<Self>) -> Vec<Superior>;
}

/// When to move, and where to (pure; [`watch`] acts on it).
#[derive(Debug, Clone)]
pub struct Plan {
    chain: Vec<Superior>,
    after_ns: i64,
    down_since: Option<i64>,
    tried: BTreeSet<String>,
}

impl Plan {
    pub fn new(chain: Vec<Superior>, after: Duration) -> Plan {
        Plan {
            chain,
            after_ns: i64::try_from(after.as_nanos()).unwrap_or(i64::MAX),
            down_since: None,
            tried: BTreeSet::new(),
        }
    }

    /// The chain changed (a parent told new superiors): what is tried from now on.
    pub fn set_chain(&mut self, chain: Vec<Superior>) {
        self.chain = chain;
    }

    /// `parents`: each parent link's site and whether its session is live. The superior to
    /// attach to now, if every parent has been silent for the configured time; each superior
    /// of the chain is tried once per outage (then the chain starts over), one per period.
    pub fn decide(&mut self, parents: &[(String, bool)], now: i64) -> Option<Superior> {
        if parents.is_empty() || parents.iter().any(|(_, live)| *live) {
            self.down_since = None;
            self.tried.clear();
            return None;
        }
        let since = *self.down_since.get_or_insert(now);
        if now.saturating_sub(since) < self.after_ns {
            return None;
        }
        let fresh = |s: &Superior, tried: &BTreeSet<String>| {
            !tried.contains(&s.site) && !parents.iter().any(|(p, _)| *p == s.site)
        };
        if !self.chain.iter().any(|s| fresh(s, &self.tried)) {
            self.tried.clear();
        }
        let next = self.chain.iter().find(|s| fresh(s, &self.tried))?.clone();
        self.tried.insert(next.site.clone());
        // The next one gets a full period to answer.
        self.down_since = Some(now);
        Some(next)
    }
}

async fn attach(
    me: &str,
    own_dir: &str,
    own_endpoint: &str,
    to: &Superior,
    silent: &[String],
) -> Result<(), crate::error::Error> {
    let child = Link {
        site: me.to_string(),
        endpoint: own_endpoint.to_string(),
        role: Role::Child,
        hops: 0,
    };
    links::add(&to.directory, &child).await?;
    let parent = Link {
        site: to.site.clone(),
        endpoint: to.endpoint.clone(),
        role: Role::Parent,
        hops: 0,
    };
    links::add(own_dir, &parent).await?;
    for s in silent {
        links::remove(own_dir, s).await?;
    }
    Ok(())
}

/// Watches the parent links of the endpoint and re-attaches (see the module doc); runs until
/// aborted. `own_dir`: the site's directory; `own_endpoint`: the address this endpoint
/// listens on (what the superior dials).
pub async fn watch<W: Watched>(sh: Arc<W>, own_dir: String, own_endpoint: String) {
    let cfg = sh.config().clone();
    let mut plan = Plan::new(cfg.superior.clone(), Duration::from_millis(cfg.reattach_after_ms));
    let mut tick = tokio::time::interval(Duration::from_millis(
        cfg.heartbeat_ms.min(cfg.reattach_after_ms).max(10),
    ));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let parents = sh.parents();
        plan.set_chain(sh.chain());
        let Some(to) = plan.decide(&parents, sh.now()) else {
            continue;
        };
        let silent: Vec<String> = parents.into_iter().map(|(p, _)| p).collect();
        match attach(sh.site(), &own_dir, &own_endpoint, &to, &silent).await {
            Ok(()) => {
                metrics::counter!("gma_federation_reattachments_total").increment(1);
                tracing::warn!(
                    site = %sh.site(),
                    superior = %to.site,
                    endpoint = %to.endpoint,
                    silent = ?silent,
                    "federation re-attached: every parent was silent for {} ms",
                    cfg.reattach_after_ms
                );
            }
            Err(e) => {
                metrics::counter!("gma_federation_reattach_errors_total").increment(1);
                tracing::warn!(site = %sh.site(), superior = %to.site, error = %e, "federation re-attachment failed; the next superior is tried after reattach_after_ms");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sup(s: &str) -> Superior {
        Superior {
            site: s.into(),
            endpoint: format!("{s}:1"),
            directory: format!("{s}:2"),
        }
    }

    const MS: i64 = 1_000_000;

    #[test]
    fn moves_after_the_silence_along_the_chain_once_per_period() {
        let mut p = Plan::new(vec![sup("R"), sup("S")], Duration::from_millis(100));
        let a = |live: bool| vec![("A".to_string(), live)];
        // A live parent, or none at all: stay.
        assert_eq!(p.decide(&a(true), 0), None);
        assert_eq!(p.decide(&[], 500 * MS), None);
        // Silent, not yet long enough.
        assert_eq!(p.decide(&a(false), 1000 * MS), None);
        assert_eq!(p.decide(&a(false), 1099 * MS), None);
        assert_eq!(p.decide(&a(false), 1100 * MS).map(|s| s.site), Some("R".into()));
        // R attached but silent too: S after another full period, not before.
        let r = vec![("R".to_string(), false)];
        assert_eq!(p.decide(&r, 1150 * MS), None);
        assert_eq!(p.decide(&r, 1200 * MS).map(|s| s.site), Some("S".into()));
        // S silent as well: the chain starts over, skipping the current parent.
        let s = vec![("S".to_string(), false)];
        assert_eq!(p.decide(&s, 1300 * MS).map(|s| s.site), Some("R".into()));
        // A parent answers: the outage is over.
        assert_eq!(p.decide(&[("R".to_string(), true)], 1350 * MS), None);
        assert_eq!(p.decide(&a(false), 1400 * MS), None);
        assert_eq!(p.decide(&a(false), 1500 * MS).map(|s| s.site), Some("R".into()));
    }

    #[test]
    fn an_empty_chain_never_moves() {
        let mut p = Plan::new(vec![], Duration::from_millis(1));
        assert_eq!(p.decide(&[("A".to_string(), false)], 0), None);
        assert_eq!(p.decide(&[("A".to_string(), false)], 1_000 * MS), None);
    }
}
