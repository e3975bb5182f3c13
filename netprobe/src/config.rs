//! `gma netprobe --config FILE`: one TOML table, unknown keys rejected, validated once.

use gma_core::Refuse;
use serde::Deserialize;

use crate::clique::Settings;
use crate::error::Error;

/// Largest transfer a probe may make (and a target accepts).
pub const MAX_TRANSFER_BYTES: u64 = 64 << 20;
/// Largest echo payload.
pub const MAX_ECHO_BYTES: usize = 64 << 10;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NetprobeConfig {
    /// Listen address (`10.0.0.5:7700`): producer, Probe and Clique services.
    pub listen: String,
    /// This host's name: `net.rtt` / `net.bw` series are `<source>/<peer>`; default: the
    /// kernel host name. No `/` in it.
    pub source: Option<String>,
    /// The registration keys ([`gma_core::registration::Registration`]): `directory`,
    /// required (the clique is the netprobes of one site in it); `advertise`, the address
    /// given to peers and consumers (default: the bound address); `id`, the record id and
    /// member id (default `<source>@<advertised address>`); `site`, the clique: netprobes with
    /// the same site probe each other, one at a time; `org`; `lease_ttl_ms`.
    #[serde(flatten)]
    pub registration: gma_core::registration::Registration,
    /// Shortest turn of a token holder (its probes plus rest), ms: the clique makes at most one
    /// turn per period, so each host holds the token every `members × period_ms`.
    pub period_ms: u64,
    /// No proof of the token for this long: it is lost and regenerated (by one member), ms.
    pub token_timeout_ms: u64,
    /// Peers a holder probes per turn (round robin).
    pub peers_per_turn: usize,
    /// Bytes of one throughput probe.
    pub transfer_bytes: u64,
    /// Size of the messages a transfer is cut into.
    pub chunk_bytes: usize,
    /// Round trips per latency probe (the minimum is reported).
    pub echoes: u32,
    /// Payload of one echo.
    pub echo_bytes: usize,
    /// Cap on probe payload bytes per second through this host (sent + received, as prober
    /// and as target); a transfer that would exceed it is skipped and counted.
    pub max_bytes_per_s: u64,
    /// Longest probe of one peer (echoes + transfer), ms; a slower one is abandoned.
    pub probe_timeout_ms: u64,
    /// Timeout of a notice or a pass, ms.
    pub rpc_timeout_ms: u64,
    /// Period of the `net.probe` cost event, ms.
    pub report_ms: u64,
    /// Events kept for resuming consumers.
    pub buffer_events: usize,
    /// The shared endpoint keys (`[tls]`, `access_policy`, `[limits]`, `metrics_listen`,
    /// `rpc_events_ms`): see [`gma_core::endpoint::Endpoint`].
    #[serde(flatten)]
    pub endpoint: gma_core::endpoint::Endpoint,
}

impl Default for NetprobeConfig {
    fn default() -> Self {
        NetprobeConfig {
            listen: "127.0.0.1:7700".into(),
            source: None,
            registration: Default::default(),
            period_ms: 1000,
            token_timeout_ms: 10_000,
            peers_per_turn: 1,
            transfer_bytes: 256 << 10,
            chunk_bytes: 64 << 10,
            echoes: 3,
            echo_bytes: 64,
            max_bytes_per_s: 256 << 10,
            probe_timeout_ms: 3000,
            rpc_timeout_ms: 1000,
            report_ms: 10_000,
            buffer_events: 20_000,
            endpoint: Default::default(),
        }
    }
}

fn within<T: PartialOrd + std::fmt::Display>(name: &str, v: T, lo: T, hi: T) -> Result<(), Error> {
    if v < lo || v > hi {
        return Err(Error::invalid_argument(format!(
            "{name} must be within {lo}..={hi} (got {v})"
        )));
    }
    Ok(())
}

impl NetprobeConfig {
    /// The longest a turn can take: the notice round, the probes, the rest, and a pass to a
    /// peer that never answers (connect, then two attempts). The token timeout must exceed it.
    pub fn max_turn_ms(&self) -> u64 {
        self.rpc_timeout_ms
            + self.peers_per_turn as u64 * self.probe_timeout_ms
            + self.period_ms
            + 3 * self.rpc_timeout_ms
    }

    /// Checks every field; the error (INVALID_ARGUMENT) names the first bad one.
    pub fn validate(&self) -> Result<(), Error> {
        within("period_ms", self.period_ms, 10, 3_600_000)?;
        within("peers_per_turn", self.peers_per_turn, 1, 1024)?;
        within("transfer_bytes", self.transfer_bytes, 1024, MAX_TRANSFER_BYTES)?;
        within("chunk_bytes", self.chunk_bytes, 1024, 1 << 20)?;
        within("echoes", self.echoes, 1, 100)?;
        within("echo_bytes", self.echo_bytes, 1, MAX_ECHO_BYTES)?;
        within("max_bytes_per_s", self.max_bytes_per_s, 1024, 1 << 40)?;
        within("probe_timeout_ms", self.probe_timeout_ms, 10, 600_000)?;
        within("rpc_timeout_ms", self.rpc_timeout_ms, 10, 60_000)?;
        within("report_ms", self.report_ms, 100, 3_600_000)?;
        within("buffer_events", self.buffer_events, 100, 10_000_000)?;
        let min = self.max_turn_ms();
        if self.token_timeout_ms <= min {
            return Err(Error::invalid_argument(format!(
                "token_timeout_ms ({}) must exceed the longest turn, {min} ms (rpc_timeout_ms + \
                 peers_per_turn × probe_timeout_ms + period_ms + 3 × rpc_timeout_ms), or a slow \
                 turn is taken for a lost token",
                self.token_timeout_ms
            )));
        }
        if let Some(s) = &self.source {
            validate_host(s)?;
        }
        if self.registration.site.len() > 256 {
            return Err(Error::invalid_argument("site: at most 256 bytes"));
        }
        self.registration
            .validate()
            .and_then(|()| self.endpoint.validate())
            .map_err(|e| Error::invalid_argument(e.to_string()))?;
        Ok(())
    }

    pub fn settings(&self) -> Settings {
        Settings {
            period_ms: self.period_ms,
            timeout_ms: self.token_timeout_ms,
            peers_per_turn: self.peers_per_turn,
        }
    }

    /// Bucket size of the byte cap: one second at the cap, and at least two transfers (a host
    /// may be probed in one turn and probe in the next).
    pub fn burst_bytes(&self) -> u64 {
        self.max_bytes_per_s.max(2 * self.transfer_bytes)
    }
}

/// A host name usable in `<src>/<dst>` series names.
pub fn validate_host(h: &str) -> Result<(), Error> {
    gma_core::pattern::validate_source(h).map_err(|e| Error::invalid_argument(format!("source: {e}")))?;
    if h.contains('/') {
        return Err(Error::invalid_argument(format!(
            "source {h:?}: a netprobe's host name may not contain '/' (its links are named <src>/<dst>)"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_the_timeout_must_exceed_a_turn() {
        let c = NetprobeConfig::default();
        c.validate().unwrap();
        assert_eq!(c.max_turn_ms(), 8000);
        let bad = NetprobeConfig {
            token_timeout_ms: 8000,
            ..NetprobeConfig::default()
        };
        let e = bad.validate().unwrap_err().to_string();
        assert!(
            e.starts_with("token_timeout_ms (8000) must exceed the longest turn, 8000 ms"),
            "{e}"
        );
        let bad = NetprobeConfig {
            source: Some("a/b".into()),
            ..NetprobeConfig::default()
        };
        assert!(bad
            .validate()
            .unwrap_err()
            .to_string()
            .contains("may not contain '/'"));
        let bad = NetprobeConfig {
            transfer_bytes: 1 << 40,
            ..NetprobeConfig::default()
        };
        assert!(bad
            .validate()
            .unwrap_err()
            .to_string()
            .starts_with("transfer_bytes must be within"));
    }

    #[test]
    fn the_example_config_is_valid_and_holds_the_defaults() {
        let c: NetprobeConfig =
            gma_core::config::parse_toml(include_str!("../../config/netprobe.toml"), "netprobe.toml")
                .unwrap();
        c.validate().unwrap();
        let d = NetprobeConfig::default();
        assert_eq!(
            (
                c.period_ms,
                c.token_timeout_ms,
                c.transfer_bytes,
                c.max_bytes_per_s,
                c.report_ms
            ),
            (
                d.period_ms,
                d.token_timeout_ms,
                d.transfer_bytes,
                d.max_bytes_per_s,
                d.report_ms
            )
        );
        assert_eq!(c.registration.site, "rack1");
    }

    #[test]
    fn unknown_keys_are_rejected() {
        let r: Result<NetprobeConfig, _> =
            gma_core::config::parse_toml("period_ms = 5\nnope = 1\n", "t.toml");
        assert!(r.is_err());
        let c: NetprobeConfig =
            gma_core::config::parse_toml("period_ms = 500\nsite = \"s1\"\n", "t.toml").unwrap();
        assert_eq!((c.period_ms, c.registration.site.as_str()), (500, "s1"));
    }
}
