//! Authorization: one policy interface for the directory, producers, archiver and broker.
//!
//! Every server turns its peer into an [`Identity`] (subject CN and O of the client certificate,
//! [`identity_from_der`]; [`Identity::anonymous`] on plaintext or without a certificate) and
//! asks [`Policy::authorize`] before it acts. The answer is a [`Grant`]: a [`Decision`], the
//! rate class (`min_interval_ms`, 0 = none) and the index of the rule that decided, for messages
//! ([`Policy::describe`]). `authorize` is pure: no I/O, no clock, safe to call per request.
//!
//! # Policy files
//!
//! ```toml
//! default = "deny"          # optional; "deny" unless "allow" is written out
//! [[rule]]
//! cn = "alice"              # common-name glob (* and ?) ...
//! org = "siteA"             # ... and/or organization glob; neither = everyone, anonymous too
//! actions = ["producer.subscribe", "producer.query"]   # or ["*"]
//! resources = ["host.*"]    # default ["*"]
//! effect = "allow"          # "allow" | "summary" | "deny"
//! min_interval_ms = 0       # rate class for subscriptions granted by this rule
//! ```
//!
//! Rules are tried in file order and the first one that matches the identity, the action and
//! the resource decides; when none does, `default` does. [`Policy::allow_all`] is what runs when
//! no policy is configured.
//!
//! - **Identity.** `cn` and `org` are globs over the certificate's subject; when both are given
//!   both must match. They never match the anonymous identity (no certificate), even `cn = "*"`:
//!   `cn = "*"` means "anyone holding a certificate". Only a rule with neither key applies to
//!   anonymous peers.
//! - **Resources** are event-name patterns for every action but these: for
//!   `directory.register` the resource is the record id, for `admin`, `federation` and `job`
//!   the operation, for `dashboard.read` the route (`/api/events`), for `metrics.read` the
//!   role (`producer`). A rule whose actions are all
//!   event actions has its resources checked as event patterns
//!   ([`Pattern::event`](crate::pattern::Pattern::event)); other rules as source-like patterns
//!   (printable ASCII, no spaces, `*` and `?`).
//! - **Summary names.** A rule matches a summary name (`host.cpu.avg1m`, see
//!   [`is_summary_name`]) when it matches the name itself *or its base* (`host.cpu`): whoever may
//!   see a series may see its summaries, and a `deny` of a series denies its summaries too.
//! - **`summary`** grants only the derived summaries. Asked about a summary name (or a pattern
//!   all of whose names are summaries, like `*.avg1m`) it answers [`Decision::Allow`]; asked
//!   about anything else it answers [`Decision::AllowSummaryOnly`], meaning "serve `<name>.avg1m`,
//!   `.avg10m`, `.avg60m` of the matching series, never the raw events". So a `summary` rule on
//!   `host.*` gives `Allow` for `host.cpu.avg1m` and `AllowSummaryOnly` for `host.cpu`. For
//!   the actions whose resource is not an event (`directory.register`, `admin`, `federation`,
//!   `job`, `dashboard.read`, `metrics.read`) a `summary` rule denies.
//!
//! # Patterns as resources
//!
//! A subscription or search names a pattern (`host.*`); callers pass it as it is (an empty
//! pattern, "any", as `*`), once per pattern. The answer is the strictest over every name the
//! pattern can match: rules are scanned in order; each rule that overlaps the pattern
//! contributes its decision, and the scan stops at the first rule that covers the whole pattern
//! (or falls back to `default`). The strictest contribution wins (`Deny` < `AllowSummaryOnly`
//! < `Allow`) and the rate class is the largest of the non-deny contributions. Hence a carve-out
//! (`deny host.secret`) denies `host.*` as a whole: the subscriber narrows the pattern or the
//! producer filters by calling `authorize` per concrete name. Overlap is exact; "covers" is a
//! sound approximation (a pattern it cannot prove covered counts as merely overlapping, which
//! errs towards the stricter answer).
//!
//! What a caller does with the answer: `Allow` → serve; `AllowSummaryOnly` → a producer forces
//! summaries for that pattern (the directory may show the summary records only); `Deny` →
//! `PERMISSION_DENIED` with [`Policy::describe`] naming the rule.
//!
//! # Worked example
//!
//! ```
//! use gma_core::authz::{Action, Decision, Identity, Policy};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let policy = Policy::parse_toml(r#"
//! default = "deny"
//!
//! ## 0: siteA's operators may do anything.
//! [[rule]]
//! cn = "ops-*"
//! org = "siteA"
//! actions = ["*"]
//! effect = "allow"
//!
//! ## 1: nobody else sees host.secret (nor host.secret.avg1m ...).
//! [[rule]]
//! actions = ["*"]
//! resources = ["host.secret"]
//! effect = "deny"
//!
//! ## 2: siteB sees host summaries only, at most one event per series every 5 s.
//! [[rule]]
//! org = "siteB"
//! actions = ["producer.subscribe", "producer.query", "directory.search"]
//! resources = ["host.*"]
//! effect = "summary"
//! min_interval_ms = 5000
//!
//! ## 3: every certificate holder may register and look up records.
//! [[rule]]
//! cn = "*"
//! actions = ["directory.register", "directory.search", "directory.watch"]
//! effect = "allow"
//! "#, "example.toml")?;
//!
//! let ops = Identity::new("ops-1", "siteA");
//! let bob = Identity::new("bob", "siteB");
//! let sub = Action::ProducerSubscribe;
//!
//! assert_eq!(policy.authorize(&ops, sub, "*").decision, Decision::Allow);
//! // bob: raw host.cpu is summary-only, its summaries are allowed, both at the 5 s rate.
//! let g = policy.authorize(&bob, sub, "host.cpu");
//! assert_eq!((g.decision, g.min_interval_ms, g.rule), (Decision::AllowSummaryOnly, 5000, Some(2)));
//! assert_eq!(policy.authorize(&bob, sub, "host.cpu.avg1m").decision, Decision::Allow);
//! assert_eq!(policy.authorize(&bob, sub, "host.c*").decision, Decision::AllowSummaryOnly);
//! // host.* includes host.secret, which rule 1 denies: the whole pattern is denied.
//! let g = policy.authorize(&bob, sub, "host.*");
//! assert_eq!((g.decision, g.rule), (Decision::Deny, Some(1)));
//! assert_eq!(policy.describe(&g), "the rule at example.toml line 12");
//! assert_eq!(policy.authorize(&bob, sub, "host.secret.avg10m").decision, Decision::Deny);
//! assert_eq!(policy.authorize(&bob, sub, "net.rx").decision, Decision::Deny); // default
//! // Registration: the resource is the record id.
//! let reg = Action::DirectoryRegister;
//! assert_eq!(policy.authorize(&bob, reg, "prod-bob:7001").decision, Decision::Allow);
//! // No certificate: no rule with a cn or org applies.
//! let anon = Identity::anonymous();
//! assert_eq!(policy.authorize(&anon, Action::DirectorySearch, "*").decision, Decision::Deny);
//! # Ok(())
//! # }
//! ```

use std::fmt;
use std::path::Path;
use std::str::FromStr;

use serde::de::{self, Deserializer};
use serde::Deserialize;
use toml::Spanned;

use crate::config::{parse_toml, ConfigError};
use crate::pattern::{glob_with, patterns_intersect, Pattern};

/// Who is asking: the subject CN and O of the peer's certificate.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Identity {
    pub cn: String,
    pub org: String,
}

impl Identity {
    pub fn new(cn: impl Into<String>, org: impl Into<String>) -> Identity {
        Identity {
            cn: cn.into(),
            org: org.into(),
        }
    }

    /// The identity of a peer without a certificate (plaintext): CN and O empty.
    pub fn anonymous() -> Identity {
        Identity::new("", "")
    }

    pub fn is_anonymous(&self) -> bool {
        self.cn.is_empty() && self.org.is_empty()
    }
}

impl fmt::Display for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.cn.is_empty(), self.org.is_empty()) {
            (true, true) => f.write_str("anonymous"),
            (false, true) => write!(f, "CN={}", self.cn),
            (true, false) => write!(f, "O={}", self.org),
            (false, false) => write!(f, "CN={}, O={}", self.cn, self.org),
        }
    }
}

/// Extracts the identity (subject CN and O) from a DER X.509 certificate, e.g. the first of
/// tonic's `request.peer_certs()`. A missing attribute is empty; the first CN (and first O)
/// counts when there are several. A subject with neither is an error, so a certificate never
/// passes for [`Identity::anonymous`]. The certificate is parsed, not verified: that is the TLS
/// layer's job.
pub fn identity_from_der(cert_der: &[u8]) -> Result<Identity, crate::Error> {
    let bad = crate::Error::Certificate;
    let (_, cert) = x509_parser::parse_x509_certificate(cert_der)
        .map_err(|e| bad(format!("cannot parse the peer certificate: {e}")))?;
    let subject = cert.subject();
    let text = |attr: Option<&x509_parser::x509::AttributeTypeAndValue<'_>>, what: &str| {
        attr.map_or(Ok(String::new()), |a| {
            a.as_str().map(str::to_string).map_err(|e| {
                bad(format!(
                    "certificate subject {subject}: {what} is not a string: {e}"
                ))
            })
        })
    };
    let cn = text(subject.iter_common_name().next(), "CN")?;
    let org = text(subject.iter_organization().next(), "O")?;
    if cn.is_empty() && org.is_empty() {
        return Err(bad(format!(
            "certificate subject {subject:?} has neither a CN nor an O: cannot name the peer"
        )));
    }
    Ok(Identity { cn, org })
}

/// What an identity asks to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    DirectorySearch,
    DirectoryRegister,
    DirectoryWatch,
    ProducerSubscribe,
    ProducerQuery,
    Ingest,
    ArchiveQuery,
    BrokerSelect,
    /// Create, modify, release and list advance reservations at a resource manager.
    Reserve,
    /// Site-to-site federation calls (the resource is the operation: `session`,
    /// `job.forward`, `job.start`, `job.watch`, `job.cancel`, `job.list`).
    Federation,
    /// A site scheduler's local job API (the resource is the operation: `submit`, `status`,
    /// `cancel`, `list`, `federation.status`).
    Job,
    Admin,
    /// Opening the web dashboard's data routes (the resource is the route: `/api/snapshot`,
    /// `/api/events`, `/api/history`, `/api/archive/series`). What the routes then show is
    /// decided per event name by the data's own action (`producer.subscribe`,
    /// `archive.query`, `directory.search`).
    DashboardRead,
    /// Scraping a role's Prometheus endpoint (the resource is the role: `directory`,
    /// `producer`, `archiver`, `dashboard`, ...). A producer's sensor values (`--prometheus`)
    /// also need `producer.query` allowed raw on each event name.
    MetricsRead,
    /// Steering a producer's sensors at run time (the resource is the operation:
    /// `sensors.list`, `sensor.period`, `sensor.enable`, `sensor.disable`, `watch.add`,
    /// `watch.remove`, `rule.add`, `rule.remove`; docs/control.md).
    ProducerControl,
}

impl Action {
    pub const ALL: [Action; 15] = [
        Action::DirectorySearch,
        Action::DirectoryRegister,
        Action::DirectoryWatch,
        Action::ProducerSubscribe,
        Action::ProducerQuery,
        Action::Ingest,
        Action::ArchiveQuery,
        Action::BrokerSelect,
        Action::Reserve,
        Action::Federation,
        Action::Job,
        Action::Admin,
        Action::DashboardRead,
        Action::MetricsRead,
        Action::ProducerControl,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Action::DirectorySearch => "directory.search",
            Action::DirectoryRegister => "directory.register",
            Action::DirectoryWatch => "directory.watch",
            Action::ProducerSubscribe => "producer.subscribe",
            Action::ProducerQuery => "producer.query",
            Action::Ingest => "ingest",
            Action::ArchiveQuery => "archive.query",
            Action::BrokerSelect => "broker.select",
            Action::Reserve => "reservation",
            Action::Federation => "federation",
            Action::Job => "job",
            Action::Admin => "admin",
            Action::DashboardRead => "dashboard.read",
            Action::MetricsRead => "metrics.read",
            Action::ProducerControl => "producer.control",
        }
    }

    /// True when the resource is an event name or pattern; false for `directory.register`
    /// (a record id), `admin`, `federation`, `job` (operations), `dashboard.read` (a route)
    /// and `metrics.read` (a role).
    pub fn resource_is_event(self) -> bool {
        !matches!(
            self,
            Action::DirectoryRegister
                | Action::Admin
                | Action::Federation
                | Action::Job
                | Action::DashboardRead
                | Action::MetricsRead
                | Action::ProducerControl
        )
    }

    fn bit(self) -> u16 {
        1 << (self as u16)
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Action {
    type Err = crate::Error;

    fn from_str(s: &str) -> Result<Action, crate::Error> {
        Action::ALL.into_iter().find(|a| a.as_str() == s).ok_or_else(|| {
            let all: Vec<&str> = Action::ALL.iter().map(|a| a.as_str()).collect();
            crate::Error::Value(format!(
                "unknown action {s:?}: expected one of {} or \"*\" (all)",
                all.join(", ")
            ))
        })
    }
}

/// One door of a role: an RPC (`/gma.v1.Archive/Query`) or an HTTP route (`GET
/// /api/snapshot`), who may knock at all ([`Peers`]), the actions the policy is asked (empty
/// with [`Peers::Any`]: served to anyone the listener accepts, it carries no data) and what an
/// identity granted only summaries gets there. Roles list their doors (`DOORS`); `gma doors`
/// prints every one, the door census (tests/tests/census.rs) checks every RPC of
/// `gma_proto::FILE_DESCRIPTOR_SET` and every HTTP route against them and knocks on each, and
/// the table of docs/security.md is generated from them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Door {
    pub door: &'static str,
    pub peers: Peers,
    pub actions: &'static [Action],
    pub summary_only: &'static str,
}

impl Door {
    /// A door any accepted peer may knock on, guarded by `actions` under the policy.
    pub const fn policy(door: &'static str, actions: &'static [Action], summary_only: &'static str) -> Door {
        Door {
            door,
            peers: Peers::Any,
            actions,
            summary_only,
        }
    }

    /// A door that carries no data: served to anyone the listener accepts.
    pub const fn open(door: &'static str, summary_only: &'static str) -> Door {
        Door {
            door,
            peers: Peers::Any,
            actions: &[],
            summary_only,
        }
    }

    /// A door only the members of a cluster may knock on (their certificates), then guarded
    /// by `actions` under the policy.
    pub const fn members(door: &'static str, actions: &'static [Action], summary_only: &'static str) -> Door {
        Door {
            door,
            peers: Peers::Members,
            actions,
            summary_only,
        }
    }

    /// True when nothing but the listener's TLS guards the door.
    pub fn is_open(&self) -> bool {
        self.peers == Peers::Any && self.actions.is_empty()
    }

    /// The method and path of an HTTP door (`GET /api/events`, `GET /metrics
    /// (--metrics-listen)` -> `("GET", "/metrics")`); `None` for an RPC (`/gma.v1.X/Y`).
    pub fn http_route(&self) -> Option<(&'static str, &'static str)> {
        let (method, rest) = self.door.split_once(' ')?;
        if method.is_empty() || !method.bytes().all(|b| b.is_ascii_uppercase()) {
            return None;
        }
        let path = rest.split(' ').next().unwrap_or(rest);
        path.starts_with('/').then_some((method, path))
    }
}

/// Who may knock on a door before the policy is asked anything.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Peers {
    /// Any peer the listener accepts (its TLS and client CA); the actions decide.
    Any,
    /// Directory members only: a verified certificate matching a `[[members]]` entry, CN and O
    /// (docs/security.md, the member rule); anyone else gets `PERMISSION_DENIED`.
    Members,
    /// Linked sites only: the caller names its site, its certificate CN must be that site and
    /// the site must be linked to this endpoint (docs/federation.md).
    LinkedSites,
}

impl Peers {
    pub fn as_str(self) -> &'static str {
        match self {
            Peers::Any => "any",
            Peers::Members => "members",
            Peers::LinkedSites => "linked sites",
        }
    }
}

/// The answer of [`Policy::authorize`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    Allow,
    /// Only derived summary events (`<name>.avg1m`, `.avg10m`, `.avg60m`) of what was asked.
    AllowSummaryOnly,
    Deny,
}

impl Decision {
    /// Strictness order: Deny (0) < AllowSummaryOnly (1) < Allow (2).
    fn rank(self) -> u8 {
        match self {
            Decision::Deny => 0,
            Decision::AllowSummaryOnly => 1,
            Decision::Allow => 2,
        }
    }
}

/// A decision with its rate class and the rule that made it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant {
    pub decision: Decision,
    /// Rate class: the least interval between two events of one series delivered to this
    /// identity (0 = no limit). Always 0 on `Deny`.
    pub min_interval_ms: u64,
    /// Index (0-based, file order) of the deciding rule; `None` when the default decided.
    pub rule: Option<usize>,
}

impl Grant {
    /// True unless denied.
    pub fn is_allowed(&self) -> bool {
        self.decision != Decision::Deny
    }
}

/// Suffixes of derived summary series (see [`crate::rolling::WINDOWS`]).
pub const SUMMARY_SUFFIXES: [&str; 3] = [".avg1m", ".avg10m", ".avg60m"];

/// True for summary names: ending in `.avg1m`, `.avg10m` or `.avg60m` after a non-empty base.
/// Also true for a pattern all of whose names are summaries (`*.avg1m`).
pub fn is_summary_name(name: &str) -> bool {
    summary_base(name).is_some()
}

/// The series a summary name summarizes: `host.cpu` for `host.cpu.avg1m`.
pub fn summary_base(name: &str) -> Option<&str> {
    SUMMARY_SUFFIXES
        .iter()
        .find_map(|s| name.strip_suffix(s).filter(|base| !base.is_empty()))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Effect {
    Allow,
    Summary,
    Deny,
}

impl Effect {
    fn decision(self, req: &Request<'_>) -> Decision {
        match self {
            Effect::Allow => Decision::Allow,
            Effect::Deny => Decision::Deny,
            Effect::Summary if !req.event => Decision::Deny,
            Effect::Summary if is_summary_name(req.text) => Decision::Allow,
            Effect::Summary => Decision::AllowSummaryOnly,
        }
    }
}

#[derive(Debug, Clone)]
struct Rule {
    cn: Option<String>,
    org: Option<String>,
    /// Bit set of [`Action::bit`].
    actions: u16,
    resources: Vec<Pattern>,
    /// For each resource `p`: `p` and `p.avg1m`, `p.avg10m`, `p.avg60m` (what the rule reaches
    /// among event names).
    reach: Vec<String>,
    effect: Effect,
    min_interval_ms: u64,
    line: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reach {
    None,
    Some,
    All,
}

struct Request<'a> {
    event: bool,
    text: &'a str,
    wildcard: bool,
}

impl Rule {
    fn matches_identity(&self, who: &Identity) -> bool {
        if self.cn.is_none() && self.org.is_none() {
            return true;
        }
        if who.is_anonymous() {
            return false;
        }
        let ok = |pat: &Option<String>, s: &str| pat.as_deref().is_none_or(|p| name_glob(p, s));
        ok(&self.cn, &who.cn) && ok(&self.org, &who.org)
    }

    fn reach(&self, req: &Request<'_>) -> Reach {
        let hit = if !req.event {
            self.resources.iter().any(|p| p.matches(req.text))
        } else if !req.wildcard {
            let base = summary_base(req.text);
            self.resources
                .iter()
                .any(|p| p.matches(req.text) || base.is_some_and(|b| p.matches(b)))
        } else {
            if self.reach.iter().any(|r| glob_covers(r, req.text)) {
                return Reach::All;
            }
            self.reach.iter().any(|r| patterns_intersect(r, req.text))
        };
        match hit {
            false => Reach::None,
            true if req.wildcard && req.event => Reach::Some,
            true => Reach::All,
        }
    }
}

/// Folds contributions: the strictest decision wins (first such rule named); the rate class is
/// the largest among non-deny contributions.
#[derive(Default)]
struct Fold {
    worst: Option<(Decision, Option<usize>)>,
    interval: u64,
}

impl Fold {
    fn add(&mut self, d: Decision, rule: Option<usize>, interval: u64) {
        if self.worst.is_none_or(|(w, _)| d.rank() < w.rank()) {
            self.worst = Some((d, rule));
        }
        if d != Decision::Deny {
            self.interval = self.interval.max(interval);
        }
    }

    fn grant(&self) -> Grant {
        let (decision, rule) = self.worst.unwrap_or((Decision::Deny, None));
        Grant {
            decision,
            min_interval_ms: if decision == Decision::Deny {
                0
            } else {
                self.interval
            },
            rule,
        }
    }
}

/// A parsed authorization policy (rules in file order, then the default).
#[derive(Debug, Clone)]
pub struct Policy {
    origin: String,
    default: Decision,
    rules: Vec<Rule>,
}

impl Policy {
    /// Allows everything, unthrottled: what runs when no policy is configured.
    pub fn allow_all() -> Policy {
        Policy {
            origin: "(no policy: allow all)".to_string(),
            default: Decision::Allow,
            rules: Vec::new(),
        }
    }

    /// Reads and parses a policy file.
    pub fn load(path: &Path) -> Result<Policy, ConfigError> {
        let origin = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: origin.clone(),
            source,
        })?;
        Policy::parse_toml(&text, &origin)
    }

    /// Parses policy TOML; `origin` names it in errors, which give line and column.
    pub fn parse_toml(text: &str, origin: &str) -> Result<Policy, ConfigError> {
        let raw: RawPolicy = parse_toml(text, origin)?;
        let fail = |offset: usize, message: String| ConfigError::Parse {
            path: origin.to_string(),
            message: format!("{}{message}", at(text, offset)),
        };
        let mut rules = Vec::with_capacity(raw.rule.len());
        for r in raw.rule {
            let actions_at = r.actions.span().start;
            let mut actions = 0u16;
            for a in r.actions.get_ref() {
                actions |= a.0.map_or(u16::MAX, Action::bit);
            }
            if actions == 0 {
                return Err(fail(
                    actions_at,
                    "actions must list at least one action (\"*\" for all)".to_string(),
                ));
            }
            let event_only = Action::ALL
                .iter()
                .all(|a| actions & a.bit() == 0 || a.resource_is_event());
            let any_event = Action::ALL
                .iter()
                .any(|a| actions & a.bit() != 0 && a.resource_is_event());
            let effect = *r.effect.get_ref();
            if effect.0 == Effect::Summary && !any_event {
                return Err(fail(
                    r.effect.span().start,
                    "effect \"summary\" applies to event actions only (directory.register and admin \
                     have no summaries): use \"allow\" or \"deny\""
                        .to_string(),
                ));
            }
            let mut who = [None, None];
            for (slot, (key, value)) in who.iter_mut().zip([("cn", r.cn), ("org", r.org)]) {
                if let Some(v) = value {
                    if v.get_ref().is_empty() {
                        return Err(fail(
                            v.span().start,
                            format!("{key} must not be empty (leave it out to match any {key})"),
                        ));
                    }
                    *slot = Some(v.into_inner());
                }
            }
            let [cn, org] = who;
            let mut resources = Vec::new();
            match r.resources {
                None => resources.push(Pattern::any()),
                Some(list) => {
                    if list.get_ref().is_empty() {
                        return Err(fail(
                            list.span().start,
                            "resources must list at least one pattern (leave it out for \"*\")".to_string(),
                        ));
                    }
                    for res in list.into_inner() {
                        let parsed = if event_only {
                            Pattern::event(res.get_ref())
                        } else {
                            Pattern::source(res.get_ref()).map_err(|mut e| {
                                e.what = "resource pattern";
                                e
                            })
                        };
                        resources.push(parsed.map_err(|e| fail(res.span().start, e.to_string()))?);
                    }
                }
            }
            let reach = resources
                .iter()
                .flat_map(|p| {
                    std::iter::once(p.as_str().to_string())
                        .chain(SUMMARY_SUFFIXES.iter().map(move |s| format!("{}{s}", p.as_str())))
                })
                .collect();
            rules.push(Rule {
                cn,
                org,
                actions,
                resources,
                reach,
                effect: effect.0,
                min_interval_ms: r.min_interval_ms,
                line: rule_line(text, actions_at),
            });
        }
        Ok(Policy {
            origin: origin.to_string(),
            default: raw.default.map_or(Decision::Deny, |d| d.0),
            rules,
        })
    }

    /// Decides whether `who` may do `action` on `resource`: an event name or pattern (empty
    /// = `*`), or for `directory.register` the record id, for `admin` the operation. Pure.
    pub fn authorize(&self, who: &Identity, action: Action, resource: &str) -> Grant {
        let text = if resource.is_empty() { "*" } else { resource };
        let event = action.resource_is_event();
        let req = Request {
            event,
            text,
            wildcard: event && text.contains(['*', '?']),
        };
        let mut fold = Fold::default();
        for (i, rule) in self.rules.iter().enumerate() {
            if rule.actions & action.bit() == 0 || !rule.matches_identity(who) {
                continue;
            }
            let reach = rule.reach(&req);
            if reach == Reach::None {
                continue;
            }
            fold.add(rule.effect.decision(&req), Some(i), rule.min_interval_ms);
            if reach == Reach::All {
                return fold.grant();
            }
        }
        fold.add(self.default, None, 0);
        fold.grant()
    }

    /// Names what decided `grant`, for messages: "the rule at policy.toml line 12" or "the
    /// default of policy.toml".
    pub fn describe(&self, grant: &Grant) -> String {
        match grant.rule.and_then(|i| self.rules.get(i)) {
            Some(r) => format!("the rule at {} line {}", self.origin, r.line),
            None => format!("the default of {}", self.origin),
        }
    }

    /// Where the policy came from (file path, or a note for [`Policy::allow_all`]).
    pub fn origin(&self) -> &str {
        &self.origin
    }

    /// True for a policy that allows every action to everyone (no rules, default allow).
    pub fn allows_everything(&self) -> bool {
        self.rules.is_empty() && self.default == Decision::Allow
    }

    /// Number of rules.
    pub fn len(&self) -> usize {
        self.rules.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }
}

// ---- TOML shape -------------------------------------------------------------------------------

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPolicy {
    #[serde(default)]
    default: Option<DefaultSpec>,
    #[serde(default)]
    rule: Vec<RawRule>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRule {
    cn: Option<Spanned<String>>,
    org: Option<Spanned<String>>,
    actions: Spanned<Vec<ActionSpec>>,
    resources: Option<Spanned<Vec<Spanned<String>>>>,
    effect: Spanned<EffectSpec>,
    #[serde(default)]
    min_interval_ms: u64,
}

/// One entry of `actions`: an action, or `None` for `"*"`.
struct ActionSpec(Option<Action>);

#[derive(Clone, Copy)]
struct EffectSpec(Effect);

struct DefaultSpec(Decision);

/// Deserializes a string through `parse` inside the deserializer, so TOML errors carry the
/// value's line and column.
fn de_str<'de, D, T>(
    d: D,
    what: &'static str,
    parse: fn(&str) -> Result<T, crate::Error>,
) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
{
    struct V<T> {
        what: &'static str,
        parse: fn(&str) -> Result<T, crate::Error>,
    }
    impl<T> de::Visitor<'_> for V<T> {
        type Value = T;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "{} (a string)", self.what)
        }
        fn visit_str<E: de::Error>(self, s: &str) -> Result<T, E> {
            (self.parse)(s).map_err(E::custom)
        }
    }
    d.deserialize_str(V { what, parse })
}

impl<'de> Deserialize<'de> for ActionSpec {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        de_str(d, "an action", |s| match s {
            "*" => Ok(ActionSpec(None)),
            s => s.parse().map(|a| ActionSpec(Some(a))),
        })
    }
}

impl<'de> Deserialize<'de> for EffectSpec {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        de_str(d, "an effect", |s| match s {
            "allow" => Ok(EffectSpec(Effect::Allow)),
            "summary" => Ok(EffectSpec(Effect::Summary)),
            "deny" => Ok(EffectSpec(Effect::Deny)),
            s => Err(crate::Error::Value(format!(
                "unknown effect {s:?}: expected \"allow\", \"summary\" or \"deny\""
            ))),
        })
    }
}

impl<'de> Deserialize<'de> for DefaultSpec {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        de_str(d, "a default", |s| match s {
            "allow" => Ok(DefaultSpec(Decision::Allow)),
            "deny" => Ok(DefaultSpec(Decision::Deny)),
            s => Err(crate::Error::Value(format!(
                "unknown default {s:?}: expected \"deny\" or \"allow\""
            ))),
        })
    }
}

/// "line L, column C: " for a byte offset of `text` (as [`crate::config::parse_toml`] writes).
fn at(text: &str, offset: usize) -> String {
    let before = text.get(..offset.min(text.len())).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let col = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
    format!("line {line}, column {col}: ")
}

/// The line of the `[[rule]]` header above `offset` (or of `offset` itself for inline tables).
fn rule_line(text: &str, offset: usize) -> usize {
    let before = text.get(..offset.min(text.len())).unwrap_or(text);
    let mut line = before.matches('\n').count() + 1;
    for (i, l) in before.lines().enumerate() {
        let l: String = l.chars().filter(|c| !c.is_whitespace()).collect();
        if l.starts_with("[[rule]]") {
            line = i + 1;
        }
    }
    line
}

// ---- globs ------------------------------------------------------------------------------------

/// Glob over characters for CN and O (`*`, `?` = one character).
/// True when `name` matches `pattern` (`*` any run, `?` one character), whole string.
pub fn name_glob(pattern: &str, name: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let s: Vec<char> = name.chars().collect();
    glob_with(&p, &s, '*', |p, s| p == '?' || p == s)
}

/// True when every name matched by pattern `inner` is matched by pattern `outer` (sound, not
/// complete): `outer`'s `*` takes any run of `inner`'s symbols, wildcards included; its `?` any
/// one symbol but `*`; a literal only itself.
fn glob_covers(outer: &str, inner: &str) -> bool {
    glob_with(outer.as_bytes(), inner.as_bytes(), b'*', |o, i| {
        (o == b'?' && i != b'*') || o == i
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(text: &str) -> Policy {
        Policy::parse_toml(text, "p.toml").unwrap_or_else(|e| panic!("{e}"))
    }

    fn err(text: &str) -> String {
        Policy::parse_toml(text, "p.toml").unwrap_err().to_string()
    }

    fn d(p: &Policy, who: &Identity, action: Action, resource: &str) -> Decision {
        p.authorize(who, action, resource).decision
    }

    fn id(cn: &str, org: &str) -> Identity {
        Identity::new(cn, org)
    }

    use Action::*;
    use Decision::*;

    #[test]
    fn actions_round_trip() {
        for a in Action::ALL {
            assert_eq!(a.as_str().parse::<Action>().unwrap(), a);
            assert_eq!(a.to_string(), a.as_str());
        }
        let e = "producer.subscrib".parse::<Action>().unwrap_err().to_string();
        assert!(e.contains("producer.subscribe") && e.contains("admin"), "{e}");
        assert!(!DirectoryRegister.resource_is_event() && !Admin.resource_is_event());
        assert!(ProducerSubscribe.resource_is_event() && DirectorySearch.resource_is_event());
    }

    #[test]
    fn first_match_wins_in_file_order() {
        let p = policy(
            r#"
[[rule]]
cn = "alice"
actions = ["producer.subscribe"]
resources = ["host.cpu"]
effect = "deny"
[[rule]]
cn = "alice"
actions = ["producer.subscribe"]
resources = ["host.*"]
effect = "allow"
[[rule]]
actions = ["*"]
effect = "deny"
"#,
        );
        let alice = id("alice", "");
        let g = p.authorize(&alice, ProducerSubscribe, "host.cpu");
        assert_eq!((g.decision, g.rule), (Deny, Some(0)));
        let g = p.authorize(&alice, ProducerSubscribe, "host.mem");
        assert_eq!((g.decision, g.rule), (Allow, Some(1)));
        assert_eq!(p.describe(&g), "the rule at p.toml line 7");
        // The action must be listed.
        let g = p.authorize(&alice, ProducerQuery, "host.mem");
        assert_eq!((g.decision, g.rule), (Deny, Some(2)));
        // Reordered: the broad allow first shadows the deny.
        let p = policy(
            r#"
[[rule]]
cn = "alice"
actions = ["producer.subscribe"]
resources = ["host.*"]
effect = "allow"
[[rule]]
cn = "alice"
actions = ["producer.subscribe"]
resources = ["host.cpu"]
effect = "deny"
"#,
        );
        assert_eq!(d(&p, &alice, ProducerSubscribe, "host.cpu"), Allow);
        assert_eq!(p.len(), 2);
    }

    #[test]
    fn cn_and_org_globs() {
        let p = policy(
            r#"
[[rule]]
cn = "node-??"
org = "site*"
actions = ["directory.register"]
effect = "allow"
[[rule]]
org = "ops"
actions = ["admin"]
effect = "allow"
[[rule]]
cn = "*"
actions = ["directory.search"]
effect = "allow"
"#,
        );
        assert_eq!(
            d(&p, &id("node-01", "siteA"), DirectoryRegister, "prod-1:7001"),
            Allow
        );
        assert_eq!(d(&p, &id("node-01", "other"), DirectoryRegister, "x"), Deny);
        assert_eq!(d(&p, &id("node-001", "siteA"), DirectoryRegister, "x"), Deny);
        assert_eq!(d(&p, &id("node-01", ""), DirectoryRegister, "x"), Deny);
        assert_eq!(d(&p, &id("carol", "ops"), Admin, "add-learner"), Allow);
        assert_eq!(d(&p, &id("carol", "opsx"), Admin, "add-learner"), Deny);
        // Non-ASCII names: ? is one character.
        let p2 = policy("[[rule]]\ncn = \"j?rg\"\nactions = [\"*\"]\neffect = \"allow\"\n");
        assert_eq!(d(&p2, &id("jörg", ""), Ingest, "app.x"), Allow);
        // cn = "*" is any certificate holder, an O-only certificate included.
        assert_eq!(d(&p, &id("", "siteB"), DirectorySearch, "*"), Allow);
    }

    #[test]
    fn anonymous_matches_only_rules_without_cn_or_org() {
        let p = policy(
            r#"
[[rule]]
cn = "*"
actions = ["*"]
effect = "allow"
[[rule]]
org = "*"
actions = ["*"]
effect = "allow"
[[rule]]
actions = ["directory.search"]
effect = "summary"
"#,
        );
        let anon = Identity::anonymous();
        assert!(anon.is_anonymous());
        assert_eq!(anon.to_string(), "anonymous");
        assert_eq!(id("a", "b").to_string(), "CN=a, O=b");
        let g = p.authorize(&anon, DirectorySearch, "host.*");
        assert_eq!((g.decision, g.rule), (AllowSummaryOnly, Some(2)));
        assert_eq!(d(&p, &anon, ProducerSubscribe, "host.cpu"), Deny);
        assert_eq!(d(&p, &id("x", ""), ProducerSubscribe, "host.cpu"), Allow);
    }

    #[test]
    fn default_deny_unless_allow_is_written() {
        let anyone = id("bob", "siteB");
        let p = policy("");
        let g = p.authorize(&anyone, ProducerSubscribe, "host.cpu");
        assert_eq!(
            g,
            Grant {
                decision: Deny,
                min_interval_ms: 0,
                rule: None
            }
        );
        assert_eq!(p.describe(&g), "the default of p.toml");
        assert!(!g.is_allowed());
        let p = policy("default = \"deny\"\n");
        assert_eq!(d(&p, &anyone, Ingest, "app.x"), Deny);
        let p = policy(
            "default = \"allow\"\n[[rule]]\ncn = \"bob\"\nactions = [\"ingest\"]\neffect = \"deny\"\n",
        );
        assert_eq!(d(&p, &anyone, Ingest, "app.x"), Deny);
        assert_eq!(d(&p, &anyone, ProducerSubscribe, "app.x"), Allow);
        assert_eq!(d(&p, &Identity::anonymous(), Ingest, "app.x"), Allow);
        let all = Policy::allow_all();
        let g = all.authorize(&Identity::anonymous(), Admin, "anything");
        assert_eq!(
            g,
            Grant {
                decision: Allow,
                min_interval_ms: 0,
                rule: None
            }
        );
        assert!(all.is_empty());
    }

    #[test]
    fn summary_semantics() {
        assert!(is_summary_name("host.cpu.avg1m") && is_summary_name("x.avg10m"));
        assert!(is_summary_name("x.avg60m") && is_summary_name("*.avg1m"));
        assert!(!is_summary_name("host.cpu") && !is_summary_name(".avg1m"));
        assert!(!is_summary_name("host.avg5m") && !is_summary_name("host.cpu.forecast"));
        assert_eq!(summary_base("host.cpu.avg10m"), Some("host.cpu"));
        for w in crate::rolling::WINDOWS {
            assert!(SUMMARY_SUFFIXES.contains(&format!(".avg{}", w.name).as_str()));
        }
        let p = policy(
            r#"
[[rule]]
cn = "bob"
actions = ["producer.subscribe", "directory.register"]
resources = ["host.*"]
effect = "summary"
[[rule]]
cn = "carl"
actions = ["producer.subscribe"]
resources = ["host.cpu"]
effect = "summary"
[[rule]]
cn = "dora"
actions = ["producer.subscribe"]
resources = ["host.cpu"]
effect = "allow"
[[rule]]
cn = "dora"
actions = ["producer.subscribe"]
resources = ["*.avg1m"]
effect = "deny"
"#,
        );
        let bob = id("bob", "");
        assert_eq!(d(&p, &bob, ProducerSubscribe, "host.cpu.avg1m"), Allow);
        assert_eq!(d(&p, &bob, ProducerSubscribe, "host.cpu"), AllowSummaryOnly);
        assert_eq!(d(&p, &bob, ProducerSubscribe, "host.*"), AllowSummaryOnly);
        assert_eq!(d(&p, &bob, ProducerSubscribe, "host.*.avg10m"), Allow);
        assert_eq!(d(&p, &bob, ProducerSubscribe, "net.rx"), Deny);
        assert_eq!(d(&p, &bob, ProducerSubscribe, "*"), Deny); // default covers the rest
                                                               // No summaries of a registration.
        assert_eq!(d(&p, &bob, DirectoryRegister, "host.x"), Deny);
        // The rule matches the base of a summary name, not just the name.
        let carl = id("carl", "");
        assert_eq!(d(&p, &carl, ProducerSubscribe, "host.cpu.avg60m"), Allow);
        assert_eq!(d(&p, &carl, ProducerSubscribe, "host.cpu"), AllowSummaryOnly);
        // host.cpu.* also holds names the rule does not reach (host.cpu.x): the default denies.
        assert_eq!(d(&p, &carl, ProducerSubscribe, "host.cpu.*"), Deny);
        assert_eq!(d(&p, &carl, ProducerSubscribe, "host.cpux.avg1m"), Deny);
        // allow of a series allows its summaries.
        let dora = id("dora", "");
        assert_eq!(d(&p, &dora, ProducerSubscribe, "host.cpu.avg1m"), Allow);
        assert_eq!(d(&p, &dora, ProducerSubscribe, "host.mem.avg1m"), Deny);
    }

    #[test]
    fn deny_of_a_series_denies_its_summaries() {
        let p = policy(
            r#"
default = "allow"
[[rule]]
actions = ["*"]
resources = ["host.secret"]
effect = "deny"
"#,
        );
        let who = id("x", "");
        assert_eq!(d(&p, &who, ProducerSubscribe, "host.secret.avg1m"), Deny);
        assert_eq!(d(&p, &who, ProducerSubscribe, "*.avg1m"), Deny);
        assert_eq!(d(&p, &who, ProducerSubscribe, "*m"), Deny);
        assert_eq!(d(&p, &who, ProducerSubscribe, "host.public.avg1m"), Allow);
        assert_eq!(d(&p, &who, ProducerSubscribe, "net.*"), Allow);
        // Registration resources are ids, matched literally.
        assert_eq!(d(&p, &who, DirectoryRegister, "host.secret.avg1m"), Allow);
        assert_eq!(d(&p, &who, DirectoryRegister, "host.secret"), Deny);
    }

    #[test]
    fn patterns_get_the_strictest_answer_over_their_names() {
        let p = policy(
            r#"
[[rule]]
cn = "a"
actions = ["producer.subscribe"]
resources = ["host.*"]
effect = "allow"
[[rule]]
cn = "a"
actions = ["producer.subscribe"]
resources = ["net.*"]
effect = "summary"
min_interval_ms = 1000
[[rule]]
cn = "a"
actions = ["producer.subscribe"]
resources = ["app.*"]
effect = "allow"
min_interval_ms = 250
[[rule]]
cn = "a"
actions = ["producer.subscribe"]
resources = ["*"]
effect = "allow"
"#,
        );
        let a = id("a", "");
        let g = p.authorize(&a, ProducerSubscribe, "host.c*");
        assert_eq!((g.decision, g.rule, g.min_interval_ms), (Allow, Some(0), 0));
        // `*` overlaps net.* (summary, 1 s) and app.* (250 ms) before rule 3 covers it.
        let g = p.authorize(&a, ProducerSubscribe, "*");
        assert_eq!(
            (g.decision, g.rule, g.min_interval_ms),
            (AllowSummaryOnly, Some(1), 1000)
        );
        // `*.rx` overlaps net.*, nothing covers it but `*`.
        let g = p.authorize(&a, ProducerSubscribe, "*.rx");
        assert_eq!((g.decision, g.rule), (AllowSummaryOnly, Some(1)));
        let g = p.authorize(&a, ProducerSubscribe, "app.??");
        assert_eq!((g.decision, g.rule, g.min_interval_ms), (Allow, Some(2), 250));
        // The empty pattern is "any".
        assert_eq!(
            p.authorize(&a, ProducerSubscribe, ""),
            p.authorize(&a, ProducerSubscribe, "*")
        );
    }

    #[test]
    fn rate_class() {
        let p = policy(
            r#"
[[rule]]
org = "students"
actions = ["producer.subscribe"]
effect = "allow"
min_interval_ms = 10000
[[rule]]
org = "students"
actions = ["producer.query"]
effect = "deny"
min_interval_ms = 5
[[rule]]
actions = ["producer.subscribe"]
effect = "allow"
"#,
        );
        let g = p.authorize(&id("s1", "students"), ProducerSubscribe, "host.*");
        assert_eq!((g.decision, g.min_interval_ms), (Allow, 10000));
        let g = p.authorize(&id("s1", "students"), ProducerQuery, "host.cpu");
        assert_eq!((g.decision, g.min_interval_ms), (Deny, 0));
        let g = p.authorize(&id("prof", "staff"), ProducerSubscribe, "host.*");
        assert_eq!((g.decision, g.min_interval_ms, g.rule), (Allow, 0, Some(2)));
    }

    #[test]
    fn covers_is_sound() {
        assert!(glob_covers("*", "host.*"));
        assert!(glob_covers("host.*", "host.c*"));
        assert!(glob_covers("host.*", "host.*.avg1m"));
        assert!(glob_covers("h?st.*", "host.?pu"));
        assert!(glob_covers("*.avg?m", "host.*.avg1m"));
        assert!(!glob_covers("host.*", "h*"));
        assert!(!glob_covers("host.?", "host.*"));
        assert!(!glob_covers("*.cpu", "*"));
        assert!(!glob_covers("host.cpu", "host.cp?"));
        assert!(name_glob("*", "") && name_glob("a*b?", "axxbc") && !name_glob("a*b?", "axxb"));
    }

    /// Every error names the file, line and column, and what is allowed.
    #[test]
    fn config_errors_name_the_line() {
        let cases: &[(&str, &str, &[&str])] = &[
            // TOML syntax.
            ("default = \"deny\"\n[[rule]\n", "line 2", &["p.toml"]),
            // Unknown top-level key.
            ("default = \"deny\"\ndefualt = 1\n", "line 2, column 1", &["unknown field `defualt`"]),
            // Unknown rule key, with the allowed ones.
            (
                "[[rule]]\nactions = [\"*\"]\neffect = \"allow\"\nresource = [\"x\"]\n",
                "line 4, column 1",
                &["unknown field `resource`", "resources", "min_interval_ms"],
            ),
            // Unknown action.
            (
                "[[rule]]\nactions = [\"ingest\", \"producer.subscrib\"]\neffect = \"allow\"\n",
                "line 2, column 22",
                &["unknown action \"producer.subscrib\"", "producer.subscribe", "\"*\""],
            ),
            // Unknown effect.
            (
                "[[rule]]\nactions = [\"*\"]\n\neffect = \"permit\"\n",
                "line 4, column 10",
                &["unknown effect \"permit\"", "\"allow\", \"summary\" or \"deny\""],
            ),
            // Unknown default.
            ("default = \"open\"\n", "line 1, column 11", &["unknown default \"open\"", "\"deny\" or \"allow\""]),
            // Wrong type.
            (
                "[[rule]]\nactions = [\"*\"]\neffect = \"allow\"\nmin_interval_ms = -5\n",
                "line 4, column 19",
                &[],
            ),
            // Missing required keys.
            ("[[rule]]\neffect = \"allow\"\n", "line 1", &["missing field `actions`"]),
            ("\n[[rule]]\nactions = [\"*\"]\n", "line 2", &["missing field `effect`"]),
            // Empty lists and names.
            (
                "[[rule]]\n\nactions = []\neffect = \"allow\"\n",
                "line 3, column 11",
                &["at least one action"],
            ),
            (
                "[[rule]]\nactions = [\"*\"]\nresources = []\neffect = \"allow\"\n",
                "line 3, column 13",
                &["at least one pattern"],
            ),
            (
                "[[rule]]\ncn = \"\"\nactions = [\"*\"]\neffect = \"allow\"\n",
                "line 2, column 6",
                &["cn must not be empty"],
            ),
            (
                "[[rule]]\norg = \"\"\nactions = [\"*\"]\neffect = \"allow\"\n",
                "line 2, column 7",
                &["org must not be empty"],
            ),
            // Bad event pattern, with its position.
            (
                "[[rule]]\nactions = [\"producer.subscribe\"]\nresources = [\"host.*\",\n  \"host..cpu\"]\neffect = \"allow\"\n",
                "line 4, column 3",
                &["position 5", "empty name segment"],
            ),
            // Ids may hold ':' but not spaces.
            (
                "[[rule]]\nactions = [\"directory.register\"]\nresources = [\"a b\"]\neffect = \"allow\"\n",
                "line 3, column 14",
                &["invalid resource pattern \"a b\" at position 1"],
            ),
            // summary on non-event actions only.
            (
                "[[rule]]\nactions = [\"directory.register\", \"admin\"]\neffect = \"summary\"\n",
                "line 3, column 10",
                &["event actions only"],
            ),
        ];
        for (text, line, words) in cases {
            let e = err(text);
            assert!(e.starts_with("invalid config file p.toml: "), "{text:?}: {e}");
            assert!(e.contains(line), "{text:?}: want {line}: {e}");
            for w in *words {
                assert!(e.contains(w), "{text:?}: want {w:?}: {e}");
            }
        }
        // Accepted: ids with ':' for register, `*` mixed with names.
        let p = policy(
            "[[rule]]\nactions = [\"directory.register\", \"*\"]\nresources = [\"prod-*:70??\"]\neffect = \"allow\"\n",
        );
        assert_eq!(d(&p, &id("n", ""), DirectoryRegister, "prod-a:7001"), Allow);
    }

    #[test]
    fn load_reads_files() {
        let dir = std::env::temp_dir().join(format!("gma-authz-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("policy.toml");
        std::fs::write(&path, "default = \"allow\"\n").unwrap();
        let p = Policy::load(&path).unwrap();
        assert_eq!(p.origin(), path.display().to_string());
        assert_eq!(d(&p, &Identity::anonymous(), Admin, "x"), Allow);
        std::fs::write(&path, "default = \"nope\"\n").unwrap();
        let e = Policy::load(&path).unwrap_err().to_string();
        assert!(e.contains("policy.toml") && e.contains("line 1"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
        let e = Policy::load(&dir.join("missing.toml")).unwrap_err().to_string();
        assert!(e.starts_with("cannot read config file"), "{e}");
    }

    #[test]
    fn identity_from_garbage_is_an_error() {
        let e = identity_from_der(b"not a certificate").unwrap_err().to_string();
        assert!(e.starts_with("cannot parse the peer certificate"), "{e}");
    }
}
