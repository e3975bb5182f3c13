//! The gate every server role puts in front of its RPCs: authorization ([`Policy`]) plus the
//! per-identity limits of the fabric (request rate, subscriptions per connection).
//!
//! A request is turned into an [`Identity`] ([`crate::tls::peer_identity`]), charged one token
//! from that identity's bucket (anonymous peers are counted per remote IP address), and
//! authorized. Over the rate gets `RESOURCE_EXHAUSTED`, a deny `PERMISSION_DENIED`, both with a
//! message naming who and why. Streams are charged once when they open; their messages are not.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde::Deserialize;
use tonic::Request;

use crate::authz::{Action, Decision, Grant, Identity, Policy};
use crate::error::{Error, Refusal, Refuse};

/// The limits of a role (`[limits]` in role configs): per identity (request rate), per
/// connection (open subscriptions) and per listener (connections and their timeouts,
/// enforced by [`crate::conn`]).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Sustained requests per second one identity may make (unary calls and stream opens).
    pub requests_per_s: f64,
    /// Requests one identity may make in a burst above the sustained rate.
    pub burst: f64,
    /// Open subscriptions (streams) one connection may hold at once.
    pub subscriptions_per_connection: usize,
    /// Connections one listener holds at once; one more is closed when accepted
    /// ([`crate::conn`]).
    pub max_connections: usize,
    /// Connections one peer IP address may hold at once on one listener.
    pub max_connections_per_address: usize,
    /// The TLS handshake and, on gRPC listeners, the HTTP/2 preface must arrive within this
    /// many milliseconds of the accept.
    pub handshake_timeout_ms: u64,
    /// HTTP/1 listeners: a request's headers must arrive within this many milliseconds of the
    /// server starting to wait for them (also how long an idle keep-alive connection stays).
    pub header_read_timeout_ms: u64,
    /// TCP keep-alive of every accepted socket: the first probe after this many milliseconds
    /// with nothing received, then one every this many. The kernel sends and answers them;
    /// the role is not woken.
    pub keepalive_interval_ms: u64,
    /// `TCP_USER_TIMEOUT` of every accepted socket: a connection whose sent data or keep-alive
    /// probes stay unacknowledged this long is closed by the kernel. Also how long an HTTP/2
    /// PING ([`Limits::http2_ping_interval_ms`]) may go unanswered.
    pub keepalive_timeout_ms: u64,
    /// gRPC listeners: an HTTP/2 PING on a connection from which nothing has arrived for this
    /// many milliseconds (a subscriber only reads, so every this often on a stream), unanswered
    /// within [`Limits::keepalive_timeout_ms`] closes it; finds a peer whose kernel still
    /// acknowledges but whose process does not answer. 0: no pings.
    pub http2_ping_interval_ms: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            requests_per_s: 5_000.0,
            burst: 10_000.0,
            subscriptions_per_connection: 256,
            max_connections: 4096,
            max_connections_per_address: 1024,
            handshake_timeout_ms: 10_000,
            header_read_timeout_ms: 10_000,
            keepalive_interval_ms: 10_000,
            keepalive_timeout_ms: 20_000,
            http2_ping_interval_ms: 300_000,
        }
    }
}

impl Limits {
    pub fn validate(&self) -> Result<(), Error> {
        let bad = |m: String| Err(Error::Config(m));
        if !(self.requests_per_s.is_finite() && self.requests_per_s > 0.0) {
            return bad(format!(
                "limits.requests_per_s must be a positive number, not {}",
                self.requests_per_s
            ));
        }
        if !(self.burst.is_finite() && self.burst >= 1.0) {
            return bad(format!("limits.burst must be at least 1, not {}", self.burst));
        }
        if self.subscriptions_per_connection == 0 {
            return bad("limits.subscriptions_per_connection must be at least 1".into());
        }
        if self.max_connections == 0 || self.max_connections_per_address == 0 {
            return bad(
                "limits.max_connections and limits.max_connections_per_address must be at least 1".into(),
            );
        }
        for (key, ms) in [
            ("handshake_timeout_ms", self.handshake_timeout_ms),
            ("header_read_timeout_ms", self.header_read_timeout_ms),
            ("keepalive_interval_ms", self.keepalive_interval_ms),
            ("keepalive_timeout_ms", self.keepalive_timeout_ms),
        ] {
            if !(100..=86_400_000).contains(&ms) {
                return bad(format!(
                    "limits.{key} must lie in [100, 86400000] milliseconds, not {ms}"
                ));
            }
        }
        let ping = self.http2_ping_interval_ms;
        if ping != 0 && !(1_000..=86_400_000).contains(&ping) {
            return bad(format!(
                "limits.http2_ping_interval_ms must be 0 (no pings) or lie in [1000, 86400000] milliseconds, not {ping}"
            ));
        }
        Ok(())
    }
}

/// Most rate buckets kept; beyond it, full (idle) buckets are forgotten.
const MAX_BUCKETS: usize = 65_536;

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Who {
    Named(Identity),
    Anonymous(Option<IpAddr>),
}

struct Bucket {
    tokens: f64,
    at: Instant,
}

/// Authorization and limits for one server.
pub struct Gate {
    policy: Arc<Policy>,
    limits: Limits,
    buckets: Mutex<HashMap<Who, Bucket>>,
    open: Arc<Mutex<HashMap<SocketAddr, usize>>>,
}

impl std::fmt::Debug for Gate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gate")
            .field("policy", &self.policy.origin())
            .field("limits", &self.limits)
            .finish()
    }
}

impl Default for Gate {
    fn default() -> Self {
        Gate::new(Policy::allow_all(), Limits::default())
    }
}

/// Loads the policy file of a role (`access_policy = "FILE"` / `--access-policy FILE`); none allows all.
pub fn load_policy(path: Option<&PathBuf>) -> Result<Policy, Error> {
    match path {
        Some(p) => Policy::load(p).map_err(|e| Error::Config(e.to_string())),
        None => Ok(Policy::allow_all()),
    }
}

impl Gate {
    pub fn new(policy: Policy, limits: Limits) -> Gate {
        Gate {
            policy: Arc::new(policy),
            limits,
            buckets: Mutex::new(HashMap::new()),
            open: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Charges one request to the peer of `req` and returns its identity.
    pub fn admit<T>(&self, req: &Request<T>) -> Result<Identity, Refusal> {
        let id = crate::tls::peer_identity(req);
        self.admit_peer(&id, req.remote_addr())?;
        Ok(id)
    }

    /// Charges one request to the peer `id` (anonymous ones by `addr`'s IP): the rate limit
    /// of a door that is not a gRPC service (the archiver's PromQL HTTP API).
    pub fn admit_peer(&self, id: &Identity, addr: Option<std::net::SocketAddr>) -> Result<(), Refusal> {
        let who = if id.is_anonymous() {
            Who::Anonymous(addr.map(|a| a.ip()))
        } else {
            Who::Named(id.clone())
        };
        if !self.take(who) {
            return Err(Refusal::resource_exhausted(format!(
                "rate limit: {} made more than {} requests/s (burst {}); slow down and retry",
                describe_peer(id, addr),
                self.limits.requests_per_s,
                self.limits.burst
            )));
        }
        Ok(())
    }

    fn take(&self, who: Who) -> bool {
        let now = Instant::now();
        let mut buckets = match self.buckets.lock() {
            Ok(b) => b,
            Err(p) => p.into_inner(),
        };
        if buckets.len() >= MAX_BUCKETS && !buckets.contains_key(&who) {
            let (rate, burst) = (self.limits.requests_per_s, self.limits.burst);
            buckets.retain(|_, b| b.tokens + now.duration_since(b.at).as_secs_f64() * rate < burst);
        }
        let b = buckets.entry(who).or_insert(Bucket {
            tokens: self.limits.burst,
            at: now,
        });
        let refill = now.duration_since(b.at).as_secs_f64() * self.limits.requests_per_s;
        b.tokens = (b.tokens + refill).min(self.limits.burst);
        b.at = now;
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// Decides `action` on every resource (an empty list means `*`): the strictest answer, with
    /// the largest rate class. Deny is `PERMISSION_DENIED` naming the identity and the rule.
    pub fn authorize(&self, who: &Identity, action: Action, resources: &[&str]) -> Result<Grant, Refusal> {
        let all = ["*"];
        let resources = if resources.is_empty() { &all[..] } else { resources };
        let mut out: Option<Grant> = None;
        for r in resources {
            let g = self.policy.authorize(who, action, r);
            if g.decision == Decision::Deny {
                return Err(Refusal::permission_denied(format!(
                    "{who} may not {action} {r:?} (denied by {})",
                    self.policy.describe(&g)
                )));
            }
            out = Some(match out {
                None => g,
                Some(prev) => Grant {
                    decision: if g.decision == Decision::AllowSummaryOnly {
                        g.decision
                    } else {
                        prev.decision
                    },
                    min_interval_ms: prev.min_interval_ms.max(g.min_interval_ms),
                    rule: prev.rule.or(g.rule),
                },
            });
        }
        Ok(out.unwrap_or(Grant {
            decision: Decision::Allow,
            min_interval_ms: 0,
            rule: None,
        }))
    }

    /// True when `who` may read the event `name` raw (`Allow`, not summary-only, not denied).
    /// What a door serving stored or live data asks per series after a summary-only grant.
    pub fn raw_allowed(&self, who: &Identity, action: Action, name: &str) -> bool {
        self.policy.authorize(who, action, name).decision == Decision::Allow
    }

    /// `PERMISSION_DENIED` for an identity granted only summaries of `resource` (by `grant`)
    /// that asked for what only raw data answers: names the way out (`how`) and the rule.
    pub fn summary_only(&self, who: &Identity, resource: &str, grant: &Grant, how: &str) -> Refusal {
        Refusal::permission_denied(summary_only_message(&self.policy, who, resource, grant, how))
    }

    /// [`Gate::admit`] then [`Gate::authorize`].
    pub fn check<T>(
        &self,
        req: &Request<T>,
        action: Action,
        resources: &[&str],
    ) -> Result<(Identity, Grant), Refusal> {
        let who = self.admit(req)?;
        let grant = self.authorize(&who, action, resources)?;
        Ok((who, grant))
    }

    /// [`Gate::check`] for a door that serves or accepts only raw data (no summary of it
    /// exists): a summary-only grant is `PERMISSION_DENIED` naming the rule, with `how` as the
    /// way out. Returns the identity.
    pub fn check_raw<T>(
        &self,
        req: &Request<T>,
        action: Action,
        resources: &[&str],
        how: &str,
    ) -> Result<Identity, Refusal> {
        let (who, grant) = self.check(req, action, resources)?;
        if grant.decision != Decision::Allow {
            let r = resources.first().copied().unwrap_or("*");
            return Err(self.summary_only(&who, r, &grant, how));
        }
        Ok(who)
    }

    /// Claims one subscription slot of the connection of `req`, released when the returned
    /// slot is dropped. Over `subscriptions_per_connection` gets `RESOURCE_EXHAUSTED`.
    pub fn open_subscription<T>(&self, req: &Request<T>) -> Result<Slot, Refusal> {
        let Some(addr) = req.remote_addr() else {
            return Ok(Slot {
                addr: None,
                open: self.open.clone(),
            });
        };
        let mut open = match self.open.lock() {
            Ok(o) => o,
            Err(p) => p.into_inner(),
        };
        let n = open.entry(addr).or_insert(0);
        if *n >= self.limits.subscriptions_per_connection {
            return Err(Refusal::resource_exhausted(format!(
                "too many subscriptions: connection {addr} already holds {} (limit {}); close some or open another connection",
                n, self.limits.subscriptions_per_connection
            )));
        }
        *n += 1;
        Ok(Slot {
            addr: Some(addr),
            open: self.open.clone(),
        })
    }

    /// Subscriptions open on `addr`'s connection (for tests and metrics).
    pub fn open_on(&self, addr: SocketAddr) -> usize {
        self.open
            .lock()
            .map(|o| o.get(&addr).copied().unwrap_or(0))
            .unwrap_or(0)
    }
}

/// The message of [`Gate::summary_only`], for doors that answer with other errors than gRPC
/// statuses (HTTP 403):
/// `CN=bob, O=partner may read only summaries of "host.load": <how> (decided by the rule at
/// policy.toml line 8)`.
pub fn summary_only_message(
    policy: &Policy,
    who: &Identity,
    resource: &str,
    grant: &Grant,
    how: &str,
) -> String {
    format!(
        "{who} may read only summaries of {resource:?}: {how} (decided by {})",
        policy.describe(grant)
    )
}

fn describe_peer(id: &Identity, addr: Option<SocketAddr>) -> String {
    match (id.is_anonymous(), addr) {
        (true, Some(a)) => format!("anonymous peer {}", a.ip()),
        _ => id.to_string(),
    }
}

/// One open subscription of a connection; dropping it frees the slot.
#[derive(Debug)]
pub struct Slot {
    addr: Option<SocketAddr>,
    open: Arc<Mutex<HashMap<SocketAddr, usize>>>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let Some(addr) = self.addr else { return };
        let mut open = match self.open.lock() {
            Ok(o) => o,
            Err(p) => p.into_inner(),
        };
        if let Some(n) = open.get_mut(&addr) {
            *n -= 1;
            if *n == 0 {
                open.remove(&addr);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req_from(addr: &str) -> Request<()> {
        let mut r = Request::new(());
        r.extensions_mut()
            .insert(tonic::transport::server::TcpConnectInfo {
                local_addr: None,
                remote_addr: Some(addr.parse().unwrap()),
            });
        r
    }

    #[test]
    fn rate_limit_per_peer_refills() {
        let gate = Gate::new(
            Policy::allow_all(),
            Limits {
                requests_per_s: 1.0,
                burst: 3.0,
                subscriptions_per_connection: 1,
                ..Limits::default()
            },
        );
        let a = req_from("10.0.0.1:5000");
        for _ in 0..3 {
            gate.admit(&a).unwrap();
        }
        let e = gate.admit(&a).unwrap_err();
        assert_eq!(e.code(), tonic::Code::ResourceExhausted);
        assert!(e.message().contains("anonymous peer 10.0.0.1"), "{}", e.message());
        // Another peer has its own bucket.
        gate.admit(&req_from("10.0.0.2:5000")).unwrap();
    }

    #[test]
    fn subscription_slots_are_per_connection_and_freed_on_drop() {
        let gate = Gate::new(
            Policy::allow_all(),
            Limits {
                subscriptions_per_connection: 2,
                ..Limits::default()
            },
        );
        let a = req_from("10.0.0.1:5000");
        let s1 = gate.open_subscription(&a).unwrap();
        let _s2 = gate.open_subscription(&a).unwrap();
        let e = gate.open_subscription(&a).unwrap_err();
        assert_eq!(e.code(), tonic::Code::ResourceExhausted);
        assert!(e.message().contains("limit 2"), "{}", e.message());
        gate.open_subscription(&req_from("10.0.0.1:5001")).unwrap();
        drop(s1);
        assert_eq!(gate.open_on("10.0.0.1:5000".parse().unwrap()), 1);
        gate.open_subscription(&a).unwrap();
    }

    #[test]
    fn authorize_takes_the_strictest_over_resources() {
        let policy = Policy::parse_toml(
            r#"
[[rule]]
actions = ["producer.subscribe"]
resources = ["host.load"]
effect = "allow"
[[rule]]
actions = ["producer.subscribe"]
resources = ["host.cpu"]
effect = "summary"
min_interval_ms = 5000
[[rule]]
actions = ["producer.subscribe"]
resources = ["job.*"]
effect = "deny"
"#,
            "p.toml",
        )
        .unwrap();
        let gate = Gate::new(policy, Limits::default());
        let who = Identity::anonymous();
        let g = gate
            .authorize(&who, Action::ProducerSubscribe, &["host.load", "host.cpu"])
            .unwrap();
        assert_eq!(g.decision, Decision::AllowSummaryOnly);
        assert_eq!(g.min_interval_ms, 5000);
        let e = gate
            .authorize(&who, Action::ProducerSubscribe, &["host.load", "job.state"])
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::PermissionDenied);
        assert!(
            e.message()
                .contains("anonymous may not producer.subscribe \"job.state\""),
            "{}",
            e.message()
        );
        assert!(e.message().contains("p.toml line"), "{}", e.message());
    }
}
