//! Who is asking the dashboard, and whether the policy lets them.
//!
//! A browser (or a script) is identified, in this order, by:
//!
//! 1. **its client certificate** — when the dashboard serves HTTPS with a client CA (`[tls]
//!    client_ca`, `--tls-client-ca`): the subject CN and O of the verified certificate, exactly
//!    like the gRPC roles. The certificate is required unless another mode below is configured
//!    too (then it is optional);
//! 2. **an authenticating reverse proxy's headers** — `[auth] proxy_user_header` (e.g.
//!    `X-Forwarded-User`, the oauth2-proxy pattern) gives the CN and `proxy_org_header` (e.g.
//!    `X-Forwarded-Groups`; its first comma-separated value) the O, accepted only on
//!    connections from `trusted_proxies` (IP addresses or CIDR blocks). The same header from
//!    any other address is refused (401), never ignored;
//! 3. **a bearer token** — `Authorization: Bearer TOKEN` with `[auth] tokens_file` (TOML,
//!    `[[token]]` with `token`, `cn`, `org`): tokens are kept as SHA-256 digests and compared
//!    in constant time (`subtle`) against every configured token;
//!
//! and is anonymous otherwise. With a policy every data route asks it (`dashboard.read` on the
//! route, then the data's own actions, [`crate::view`]); an anonymous request the policy
//! denies is 401 (authenticate), a named one 403 naming the rule. Without a policy the
//! dashboard is open and serves on loopback only.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::http::{HeaderMap, HeaderName};
use gma_core::authz::{Action, Decision, Grant, Identity, Policy};
use gma_core::conn::Peer;
use serde::Deserialize;
use subtle::ConstantTimeEq;

use crate::{DashboardError, HttpError};

/// `[auth]` of the dashboard config (and the `--auth-*` flags).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuthConfig {
    /// Header set by the authenticating proxy with the user name (the identity's CN).
    pub proxy_user_header: Option<String>,
    /// Header set by the proxy with the user's organization or groups (the identity's O: the
    /// first comma-separated value).
    pub proxy_org_header: Option<String>,
    /// Addresses the proxy connects from (`10.0.0.5`, `10.0.0.0/24`, `::1`): the headers are
    /// accepted only on their connections.
    pub trusted_proxies: Vec<String>,
    /// Bearer tokens for scripts: a TOML file of `[[token]]` tables (`token`, `cn`, `org`).
    pub tokens_file: Option<PathBuf>,
}

impl AuthConfig {
    /// True when a mode other than client certificates is configured.
    pub fn has_other_modes(&self) -> bool {
        self.proxy_user_header.is_some() || self.tokens_file.is_some()
    }
}

/// Shortest bearer token accepted (bytes).
pub const MIN_TOKEN_BYTES: usize = 32;
/// Longest identity name taken from a proxy header (bytes).
const MAX_NAME: usize = 256;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenFile {
    #[serde(default)]
    token: Vec<TokenEntry>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenEntry {
    token: String,
    #[serde(default)]
    cn: String,
    #[serde(default)]
    org: String,
}

struct Token {
    digest: [u8; 32],
    who: Identity,
}

/// An address or a CIDR block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Net {
    addr: IpAddr,
    bits: u8,
}

impl Net {
    fn parse(s: &str) -> Result<Net, DashboardError> {
        let (a, bits) = match s.split_once('/') {
            Some((a, b)) => (a, Some(b)),
            None => (s, None),
        };
        let addr: IpAddr = a.trim().parse().map_err(|e| {
            DashboardError::Config(format!(
                "trusted proxy {s:?}: {e} (give an IP address or a CIDR block)"
            ))
        })?;
        let addr = addr.to_canonical();
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let bits = match bits {
            None => max,
            Some(b) => b.trim().parse::<u8>().ok().filter(|b| *b <= max).ok_or_else(|| {
                DashboardError::Config(format!(
                    "trusted proxy {s:?}: the prefix length must lie in 0..={max}"
                ))
            })?,
        };
        Ok(Net { addr, bits })
    }

    fn contains(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        let prefix = |a: u128, b: u128, width: u32| {
            let shift = width - u32::from(self.bits);
            shift >= width || (a >> shift) == (b >> shift)
        };
        match (self.addr, ip) {
            (IpAddr::V4(n), IpAddr::V4(i)) => prefix(u32::from(n).into(), u32::from(i).into(), 32),
            (IpAddr::V6(n), IpAddr::V6(i)) => prefix(u128::from(n), u128::from(i), 128),
            _ => false,
        }
    }
}

struct Proxy {
    /// As configured, for messages (header names are matched case-insensitively).
    user_name: String,
    user: HeaderName,
    org: Option<HeaderName>,
    from: Vec<Net>,
}

/// The dashboard's authentication and authorization (see the module documentation).
pub struct Auth {
    policy: Arc<Policy>,
    /// No policy configured: everything is served (on loopback only).
    open: bool,
    certs: bool,
    proxy: Option<Proxy>,
    tokens: Vec<Token>,
}

fn header(name: &str, what: &str) -> Result<HeaderName, DashboardError> {
    HeaderName::from_bytes(name.as_bytes())
        .map_err(|e| DashboardError::Config(format!("auth.{what} {name:?} is not a header name: {e}")))
}

fn load_tokens(path: &Path) -> Result<Vec<Token>, DashboardError> {
    let file: TokenFile =
        gma_core::config::load_toml(path).map_err(|e| DashboardError::Config(e.to_string()))?;
    let bad = |i: usize, m: &str| DashboardError::Config(format!("{}: token {}: {m}", path.display(), i + 1));
    let mut out: Vec<Token> = Vec::with_capacity(file.token.len());
    for (i, t) in file.token.into_iter().enumerate() {
        if t.token.len() < MIN_TOKEN_BYTES {
            return Err(bad(
                i,
                &format!("a token must be at least {MIN_TOKEN_BYTES} bytes long"),
            ));
        }
        if !t.token.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(bad(i, "a token is printable ASCII without spaces"));
        }
        if t.cn.is_empty() && t.org.is_empty() {
            return Err(bad(i, "give the identity it stands for (cn and/or org)"));
        }
        let digest = sha256(t.token.as_bytes());
        if out.iter().any(|o| o.digest == digest) {
            return Err(bad(i, "the same token is listed twice"));
        }
        out.push(Token {
            digest,
            who: Identity::new(t.cn, t.org),
        });
    }
    if out.is_empty() {
        return Err(DashboardError::Config(format!(
            "{}: no [[token]] in it",
            path.display()
        )));
    }
    Ok(out)
}

fn sha256(b: &[u8]) -> [u8; 32] {
    let d = ring::digest::digest(&ring::digest::SHA256, b);
    let mut out = [0u8; 32];
    out.copy_from_slice(d.as_ref());
    out
}

impl Auth {
    /// `policy`: the configured policy (`None`: open). `client_certs`: HTTPS verifies client
    /// certificates.
    pub fn new(policy: Option<Policy>, cfg: &AuthConfig, client_certs: bool) -> Result<Auth, DashboardError> {
        let proxy = match &cfg.proxy_user_header {
            Some(user) => {
                if cfg.trusted_proxies.is_empty() {
                    return Err(DashboardError::Config(
                        "auth.proxy_user_header needs auth.trusted_proxies (the addresses the proxy connects from)"
                            .into(),
                    ));
                }
                let from = cfg
                    .trusted_proxies
                    .iter()
                    .map(|s| Net::parse(s))
                    .collect::<Result<Vec<_>, _>>()?;
                Some(Proxy {
                    user_name: user.clone(),
                    user: header(user, "proxy_user_header")?,
                    org: cfg
                        .proxy_org_header
                        .as_deref()
                        .map(|h| header(h, "proxy_org_header"))
                        .transpose()?,
                    from,
                })
            }
            None => {
                if cfg.proxy_org_header.is_some() || !cfg.trusted_proxies.is_empty() {
                    return Err(DashboardError::Config(
                        "auth.proxy_org_header and auth.trusted_proxies go with auth.proxy_user_header"
                            .into(),
                    ));
                }
                None
            }
        };
        let tokens = match &cfg.tokens_file {
            Some(p) => load_tokens(p)?,
            None => Vec::new(),
        };
        let open = policy.is_none();
        if open && (proxy.is_some() || !tokens.is_empty()) {
            return Err(DashboardError::Config(
                "[auth] identifies users for the policy: give the policy too (--access-policy FILE)".into(),
            ));
        }
        Ok(Auth {
            policy: Arc::new(policy.unwrap_or_else(Policy::allow_all)),
            open,
            certs: client_certs,
            proxy,
            tokens,
        })
    }

    /// Open: no policy configured.
    pub fn is_open(&self) -> bool {
        self.open
    }

    pub fn policy(&self) -> &Arc<Policy> {
        &self.policy
    }

    /// The ways to authenticate this dashboard accepts, for 401 messages.
    fn how(&self) -> String {
        let mut ways = Vec::new();
        if self.certs {
            ways.push("present a client certificate of the dashboard's client CA".to_string());
        }
        if let Some(p) = &self.proxy {
            ways.push(format!(
                "come through the authenticating proxy (it sets {})",
                p.user_name
            ));
        }
        if !self.tokens.is_empty() {
            ways.push("send Authorization: Bearer TOKEN".to_string());
        }
        if ways.is_empty() {
            "this dashboard has no way to authenticate configured (client_ca, [auth]); the policy \
             decides for anonymous users"
                .to_string()
        } else {
            ways.join(", or ")
        }
    }

    /// Who is asking: the identity of the request's certificate, proxy headers or bearer token
    /// (in that order), anonymous without any. A proxy header from an untrusted address or an
    /// unknown token is `Unauthenticated`.
    pub fn identify(&self, peer: Option<&Peer>, headers: &HeaderMap) -> Result<Identity, HttpError> {
        if let Some(id) = peer.and_then(|p| p.cert.clone()) {
            return Ok(id);
        }
        if let Some(p) = &self.proxy {
            if let Some(user) = headers.get(&p.user) {
                let from = peer.map(|p| p.addr.ip());
                if !from.is_some_and(|ip| p.from.iter().any(|n| n.contains(ip))) {
                    return Err(HttpError::Unauthenticated(format!(
                        "the {} header is accepted only from the trusted proxies (auth.trusted_proxies); {} is not one",
                        p.user_name,
                        from.map_or("this connection".to_string(), |ip| ip.to_string())
                    )));
                }
                let text = |v: &axum::http::HeaderValue, name: &HeaderName| {
                    v.to_str()
                        .ok()
                        .map(str::trim)
                        .filter(|s| s.len() <= MAX_NAME)
                        .map(str::to_string)
                        .ok_or_else(|| {
                            HttpError::Unauthenticated(format!(
                                "the {name} header must be printable ASCII of at most {MAX_NAME} bytes"
                            ))
                        })
                };
                let cn = text(user, &p.user)?;
                let org = match p.org.as_ref().and_then(|h| headers.get(h).map(|v| (h, v))) {
                    Some((h, v)) => text(v, h)?.split(',').next().unwrap_or("").trim().to_string(),
                    None => String::new(),
                };
                if cn.is_empty() {
                    return Err(HttpError::Unauthenticated(format!(
                        "the {} header is empty",
                        p.user_name
                    )));
                }
                return Ok(Identity::new(cn, org));
            }
        }
        if !self.tokens.is_empty() {
            if let Some(v) = headers.get(axum::http::header::AUTHORIZATION) {
                let presented = v
                    .to_str()
                    .ok()
                    .and_then(|s| s.split_once(' '))
                    .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
                    .map(|(_, t)| t.trim());
                if let Some(t) = presented {
                    let d = sha256(t.as_bytes());
                    // Every configured token is compared, in constant time.
                    let mut hit = None;
                    for (i, tok) in self.tokens.iter().enumerate() {
                        if bool::from(tok.digest.ct_eq(&d)) {
                            hit = Some(i);
                        }
                    }
                    return match hit.and_then(|i| self.tokens.get(i)) {
                        Some(tok) => Ok(tok.who.clone()),
                        None => Err(HttpError::Unauthenticated("unknown bearer token".into())),
                    };
                }
            }
        }
        Ok(Identity::anonymous())
    }

    /// Whether `who` may `action` on `resource`: a deny is `Unauthenticated` for an anonymous
    /// caller (authenticate first), `Forbidden` naming the rule otherwise. A summary-only
    /// answer passes: what the caller then gets is the data route's business.
    pub fn authorize(&self, who: &Identity, action: Action, resource: &str) -> Result<Grant, HttpError> {
        let g = self.policy.authorize(who, action, resource);
        if g.decision != Decision::Deny {
            return Ok(g);
        }
        Err(if who.is_anonymous() {
            HttpError::Unauthenticated(format!(
                "{resource}: who is asking? {} (anonymous users are denied by {})",
                self.how(),
                self.policy.describe(&g)
            ))
        } else {
            HttpError::Forbidden(format!(
                "{who} may not {action} {resource:?} (denied by {})",
                self.policy.describe(&g)
            ))
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn peer(addr: &str, cert: Option<Identity>) -> Peer {
        Peer {
            addr: addr.parse().unwrap(),
            cert,
        }
    }

    fn headers(h: &[(&str, &str)]) -> HeaderMap {
        let mut m = HeaderMap::new();
        for (k, v) in h {
            m.insert(HeaderName::from_bytes(k.as_bytes()).unwrap(), v.parse().unwrap());
        }
        m
    }

    #[test]
    fn nets_match_addresses_and_blocks() {
        let n = Net::parse("10.1.0.0/16").unwrap();
        assert!(n.contains("10.1.2.3".parse().unwrap()));
        assert!(!n.contains("10.2.0.1".parse().unwrap()));
        assert!(n.contains("::ffff:10.1.9.9".parse().unwrap()), "mapped v4");
        assert!(Net::parse("0.0.0.0/0")
            .unwrap()
            .contains("1.2.3.4".parse().unwrap()));
        let one = Net::parse("127.0.0.1").unwrap();
        assert!(one.contains("127.0.0.1".parse().unwrap()) && !one.contains("127.0.0.2".parse().unwrap()));
        assert!(Net::parse("fd00::/8")
            .unwrap()
            .contains("fd12::1".parse().unwrap()));
        assert!(!Net::parse("fd00::/8")
            .unwrap()
            .contains("10.0.0.1".parse().unwrap()));
        for bad in ["10.0.0.0/33", "nope", "10.0.0.1/x", "::/129"] {
            assert!(Net::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn identities_from_certificates_proxies_and_tokens() {
        let dir = tempfile::tempdir().unwrap();
        let tokens = dir.path().join("tokens.toml");
        std::fs::write(
            &tokens,
            "[[token]]\ntoken = \"0123456789abcdef0123456789abcdef\"\ncn = \"ci\"\norg = \"site1\"\n",
        )
        .unwrap();
        let cfg = AuthConfig {
            proxy_user_header: Some("X-Forwarded-User".into()),
            proxy_org_header: Some("X-Forwarded-Groups".into()),
            trusted_proxies: vec!["10.0.0.0/24".into()],
            tokens_file: Some(tokens),
        };
        let policy = Policy::parse_toml("default = \"deny\"\n", "p.toml").unwrap();
        let auth = Auth::new(Some(policy), &cfg, true).unwrap();
        let alice = Identity::new("alice", "site1");
        // A certificate wins over everything else.
        let id = auth
            .identify(
                Some(&peer("10.9.0.1:1", Some(alice.clone()))),
                &headers(&[("X-Forwarded-User", "bob")]),
            )
            .unwrap();
        assert_eq!(id, alice);
        // Proxy headers from a trusted address; the first group is the O.
        let h = headers(&[
            ("x-forwarded-user", "bob"),
            ("X-Forwarded-Groups", "partner, ops"),
        ]);
        assert_eq!(
            auth.identify(Some(&peer("10.0.0.7:1", None)), &h).unwrap(),
            Identity::new("bob", "partner")
        );
        // ... and refused from anywhere else.
        let e = auth.identify(Some(&peer("10.0.1.7:1", None)), &h).unwrap_err();
        assert!(
            matches!(&e, HttpError::Unauthenticated(m) if m.contains("10.0.1.7 is not one")),
            "{e}"
        );
        let e = auth.identify(None, &h).unwrap_err();
        assert!(matches!(e, HttpError::Unauthenticated(_)));
        // Tokens.
        let t = headers(&[("Authorization", "Bearer 0123456789abcdef0123456789abcdef")]);
        assert_eq!(
            auth.identify(Some(&peer("10.9.0.1:1", None)), &t).unwrap(),
            Identity::new("ci", "site1")
        );
        let t = headers(&[("Authorization", "bearer 0123456789abcdef0123456789abcdeX")]);
        assert!(auth.identify(Some(&peer("10.9.0.1:1", None)), &t).is_err());
        // Nothing: anonymous, and denied as 401 naming the ways in.
        let anon = auth
            .identify(Some(&peer("10.9.0.1:1", None)), &HeaderMap::new())
            .unwrap();
        assert!(anon.is_anonymous());
        let e = auth
            .authorize(&anon, Action::DashboardRead, "/api/snapshot")
            .unwrap_err();
        match e {
            HttpError::Unauthenticated(m) => {
                assert!(
                    m.contains("client certificate")
                        && m.contains("X-Forwarded-User")
                        && m.contains("Bearer"),
                    "{m}"
                )
            }
            other => panic!("{other}"),
        }
        let e = auth
            .authorize(&alice, Action::DashboardRead, "/api/snapshot")
            .unwrap_err();
        assert!(
            matches!(&e, HttpError::Forbidden(m) if m.contains("the default of p.toml")),
            "{e}"
        );
    }

    #[test]
    fn bad_configurations_are_refused() {
        let policy = || Some(Policy::allow_all());
        let only_header = AuthConfig {
            proxy_user_header: Some("X-User".into()),
            ..Default::default()
        };
        assert!(Auth::new(policy(), &only_header, false).is_err());
        let no_policy = AuthConfig {
            trusted_proxies: vec!["127.0.0.1".into()],
            ..only_header.clone()
        };
        let e = Auth::new(None, &no_policy, false).err().unwrap().to_string();
        assert!(e.contains("--access-policy"), "{e}");
        let dir = tempfile::tempdir().unwrap();
        let tokens = dir.path().join("t.toml");
        std::fs::write(&tokens, "[[token]]\ntoken = \"short\"\ncn = \"x\"\n").unwrap();
        let cfg = AuthConfig {
            tokens_file: Some(tokens.clone()),
            ..Default::default()
        };
        let e = Auth::new(policy(), &cfg, false).err().unwrap().to_string();
        assert!(e.contains("token 1") && e.contains("at least 32"), "{e}");
        std::fs::write(
            &tokens,
            "[[token]]\ntoken = \"0123456789abcdef0123456789abcdef\"\n",
        )
        .unwrap();
        let e = Auth::new(policy(), &cfg, false).err().unwrap().to_string();
        assert!(e.contains("cn and/or org"), "{e}");
    }
}
