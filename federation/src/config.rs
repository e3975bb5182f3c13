//! `gma federation --config FILE`: the federation endpoint of one site.
//!
//! ```toml
//! site = "siteA"                 # required: this site's id (also its certificate CN under mTLS)
//! listen = "127.0.0.1:7700"
//! directory = "127.0.0.1:7000"   # the site's own directory (hosts, link records)
//! data = "/var/lib/gma/fed-a"    # job records survive a restart (none: memory only)
//! time_scale = 1.0               # simulated execution: real seconds per job second
//! heartbeat_ms = 2000            # sessions expire after session_misses beats (3)
//! summary_interval_ms = 5000     # full summary refresh; pushes on significant change between
//! push_debounce_ms = 250
//! valid_for_ms = 15000           # a summary older than this is never used
//! origin_lease_ms = 30000        # a foreign job not started is cancelled after this silence
//! max_hops = 2
//! foreign_cpus = 64              # CPUs offered to other sites (default: all)
//! accepts_foreign = true
//! status_interval_ms = 2000      # federation.status events
//! reattach_after_ms = 5000       # re-attach when every parent was silent this long
//! [rank]                         # as the broker's
//! [route]                        # policy = "ttd" (default) | "utility" (Vasques' Algorithm 1),
//!                                # hysteresis, min_gain_s, local_start_ok_s, forward_overhead_s,
//!                                # stale_penalty, in_flight_fraction
//! [[peer]]                       # links (more with `gma federation add`)
//! site = "siteB"
//! endpoint = "127.0.0.1:7701"
//! role = "peer"                  # peer | parent | child
//! [[superior]]                   # the chain of superiors beyond the parent (grandparent first)
//! site = "siteR"
//! endpoint = "127.0.0.1:7710"    # its federation endpoint
//! directory = "127.0.0.1:7010"   # its directory (where this site registers as its child)
//! ```

use gma_core::Refuse;
use std::path::PathBuf;

use gma_broker::{Annotation, RankConfig};
use serde::Deserialize;

use crate::error::Error;
use crate::route::RoutePolicy;
use crate::site::{Link, Params};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FederationConfig {
    pub listen: String,
    /// The registration keys ([`gma_core::registration::Registration`]): `site`, this site's id
    /// (required; the source of its events), `directory`, the site's own directory (hosts, link
    /// records), `id`, `advertise`, `org`, `lease_ttl_ms` (its record's and its link records').
    #[serde(flatten)]
    pub registration: gma_core::registration::Registration,
    pub data: Option<PathBuf>,
    /// Event names followed into the view.
    pub follow: Vec<String>,
    pub time_scale: f64,
    pub heartbeat_ms: u64,
    pub session_misses: u32,
    pub summary_interval_ms: u64,
    pub push_debounce_ms: u64,
    pub valid_for_ms: u32,
    pub origin_lease_ms: u64,
    pub max_hops: u32,
    pub foreign_cpus: Option<u32>,
    pub accepts_foreign: bool,
    pub status_interval_ms: u64,
    /// Period of the manager's clock (job ends, leases, retries), ms.
    pub tick_ms: u64,
    pub rank: RankConfig,
    pub route: RoutePolicy,
    pub resources: Vec<Annotation>,
    pub peer: Vec<Link>,
    /// Where to re-attach when every parent link is silent (`crate::reattach`), in order.
    pub superior: Vec<Superior>,
    /// How long every parent must be silent before the next superior is tried, ms.
    pub reattach_after_ms: u64,
    /// The shared endpoint keys (`[tls]`, `access_policy`, `[limits]`, `metrics_listen`,
    /// `rpc_events_ms`): see [`gma_core::endpoint::Endpoint`].
    #[serde(flatten)]
    pub endpoint: gma_core::endpoint::Endpoint,
}

impl Default for FederationConfig {
    fn default() -> Self {
        let p = Params::new("");
        FederationConfig {
            listen: "127.0.0.1:0".into(),
            registration: Default::default(),
            data: None,
            follow: ["host.load", "host.info"].map(String::from).to_vec(),
            time_scale: p.time_scale,
            heartbeat_ms: p.heartbeat_ms,
            session_misses: p.session_misses,
            summary_interval_ms: p.summary_interval_ms,
            push_debounce_ms: p.push_debounce_ms,
            valid_for_ms: p.valid_for_ms,
            origin_lease_ms: p.origin_lease_ms,
            max_hops: p.max_hops,
            foreign_cpus: None,
            accepts_foreign: true,
            status_interval_ms: p.status_interval_ms,
            tick_ms: 100,
            rank: RankConfig::default(),
            route: RoutePolicy::default(),
            resources: Vec::new(),
            peer: Vec::new(),
            superior: Vec::new(),
            reattach_after_ms: DEFAULT_AFTER_MS,
            endpoint: Default::default(),
        }
    }
}

/// A site id: a source name (printable ASCII, no spaces) without `/` (it starts job ids).
pub fn validate_site(site: &str) -> Result<(), Error> {
    if site.is_empty() {
        return Err(Error::invalid_argument("give the site id (site = \"...\")"));
    }
    gma_core::pattern::validate_source(site)
        .map_err(|e| Error::invalid_argument(format!("site {site:?}: {e}")))?;
    if site.contains('/') || site.contains('*') || site.contains('?') || site.len() > 128 {
        return Err(Error::invalid_argument(format!(
            "site {site:?}: at most 128 bytes, without '/', '*' or '?'"
        )));
    }
    Ok(())
}

impl FederationConfig {
    pub fn validate(&self) -> Result<(), Error> {
        validate_site(&self.registration.site)?;
        self.endpoint
            .validate()
            .and_then(|()| self.registration.validate())
            .map_err(|e| Error::invalid_argument(e.to_string()))?;
        self.rank
            .validate()
            .map_err(|e| Error::invalid_argument(e.to_string()))?;
        self.route.validate()?;
        if !(self.time_scale.is_finite() && self.time_scale > 0.0) {
            return Err(Error::invalid_argument("time_scale must be a finite number > 0"));
        }
        for (name, v, lo) in [
            ("heartbeat_ms", self.heartbeat_ms, 10),
            ("summary_interval_ms", self.summary_interval_ms, 10),
            ("origin_lease_ms", self.origin_lease_ms, 10),
            ("status_interval_ms", self.status_interval_ms, 10),
            ("tick_ms", self.tick_ms, 1),
            ("reattach_after_ms", self.reattach_after_ms, 10),
        ] {
            if v < lo || v > 86_400_000 {
                return Err(Error::invalid_argument(format!(
                    "{name} must be within {lo}..=86400000"
                )));
            }
        }
        if self.push_debounce_ms > 3_600_000 {
            return Err(Error::invalid_argument(
                "push_debounce_ms must be at most 3600000",
            ));
        }
        if self.session_misses == 0 || self.session_misses > 100 {
            return Err(Error::invalid_argument("session_misses must be within 1..=100"));
        }
        if self.valid_for_ms < 10 {
            return Err(Error::invalid_argument("valid_for_ms must be at least 10"));
        }
        if self.max_hops > 16 {
            return Err(Error::invalid_argument("max_hops must be at most 16"));
        }
        if self.follow.is_empty() {
            return Err(Error::invalid_argument("follow: give at least one event name"));
        }
        gma_core::pattern::event_patterns(&self.follow)
            .map_err(|e| Error::invalid_argument(format!("follow: {e}")))?;
        for (i, p) in self.peer.iter().enumerate() {
            validate_site(&p.site).map_err(|e| Error::invalid_argument(format!("peer[{i}]: {e}")))?;
            if p.site == self.registration.site {
                return Err(Error::invalid_argument(format!(
                    "peer[{i}]: a site is not its own peer"
                )));
            }
            if p.endpoint.is_empty() {
                return Err(Error::invalid_argument(format!(
                    "peer[{i}].endpoint: give HOST:PORT"
                )));
            }
            if p.hops > 16 {
                return Err(Error::invalid_argument(format!("peer[{i}].hops: at most 16")));
            }
        }
        for (i, s) in self.superior.iter().enumerate() {
            validate_superior(s, &self.registration.site)
                .map_err(|e| Error::invalid_argument(format!("superior[{i}]: {e}")))?;
        }
        if !self.superior.is_empty() && self.registration.directory.is_none() {
            return Err(Error::invalid_argument(
                "superior: re-attachment edits the site's links in its directory: give directory = \"HOST:PORT\"",
            ));
        }
        Ok(())
    }

    /// The job manager's settings.
    pub fn params(&self) -> Params {
        let mut p = Params::new(&self.registration.site);
        p.rank = self.rank.clone();
        p.route = self.route.clone();
        p.time_scale = self.time_scale;
        p.heartbeat_ms = self.heartbeat_ms;
        p.session_misses = self.session_misses;
        p.origin_lease_ms = self.origin_lease_ms;
        p.valid_for_ms = self.valid_for_ms;
        p.summary_interval_ms = self.summary_interval_ms;
        p.push_debounce_ms = self.push_debounce_ms;
        p.max_hops = self.max_hops;
        p.foreign_cpus = self.foreign_cpus;
        p.accepts_foreign = self.accepts_foreign;
        p.status_interval_ms = self.status_interval_ms;
        p
    }
}

pub use crate::site::Superior;

/// Longest endpoint or directory address a superior may name.
const MAX_ADDR: usize = 1024;

/// Whether `s` is a usable superior of site `me` (configured, or told by a parent).
pub fn validate_superior(s: &Superior, me: &str) -> Result<(), Error> {
    validate_site(&s.site)?;
    if s.site == me {
        return Err(Error::invalid_argument("a site is not its own superior"));
    }
    let bad = |a: &str| a.is_empty() || a.len() > MAX_ADDR;
    if bad(&s.endpoint) || bad(&s.directory) {
        return Err(Error::invalid_argument(
            "give endpoint = \"HOST:PORT\" and directory = \"HOST:PORT\"",
        ));
    }
    Ok(())
}

/// `reattach_after_ms` when the config does not say.
pub const DEFAULT_AFTER_MS: u64 = 5_000;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configs_are_validated_with_the_key_named() {
        let ok: FederationConfig = gma_core::config::parse_toml(
            "site = \"a\"\ndirectory = \"127.0.0.1:1\"\n[[peer]]\nsite = \"b\"\nendpoint = \"127.0.0.1:2\"\nrole = \"peer\"\n",
            "t",
        )
        .unwrap();
        ok.validate().unwrap();
        assert_eq!(ok.peer[0].hops(), 1);
        let bad = |text: &str, want: &str| {
            let e = match gma_core::config::parse_toml::<FederationConfig>(text, "t") {
                Err(e) => e.to_string(),
                Ok(c) => c.validate().unwrap_err().to_string(),
            };
            assert!(e.contains(want), "{text}: {e}");
        };
        bad("", "give the site id");
        bad("site = \"a/b\"\n", "without '/'");
        bad("site = \"a\"\ntime_scale = 0\n", "time_scale");
        bad("site = \"a\"\ncolour = 1\n", "unknown field `colour`");
        bad(
            "site = \"a\"\n[[peer]]\nsite = \"a\"\nendpoint = \"x:1\"\nrole = \"peer\"\n",
            "its own peer",
        );
        bad(
            "site = \"a\"\n[[peer]]\nsite = \"b\"\nendpoint = \"x:1\"\nrole = \"boss\"\n",
            "unknown variant `boss`",
        );
        bad("site = \"a\"\n[route]\nhysteresis = -1\n", "route.hysteresis");
        bad(
            "site = \"a\"\n[[superior]]\nsite = \"r\"\nendpoint = \"x:1\"\ndirectory = \"x:2\"\n",
            "give directory",
        );
        bad(
            "site = \"a\"\ndirectory = \"x:3\"\n[[superior]]\nsite = \"r\"\nendpoint = \"x:1\"\n",
            "missing field `directory`",
        );
        bad("site = \"a\"\nreattach_after_ms = 0\n", "reattach_after_ms");
    }

    #[test]
    fn the_example_config_is_valid() {
        let c: FederationConfig = gma_core::config::parse_toml(
            include_str!("../../config/federation.toml"),
            "config/federation.toml",
        )
        .unwrap();
        c.validate().unwrap();
        assert_eq!((c.registration.site.as_str(), c.peer.len()), ("siteA", 1));
    }
}
