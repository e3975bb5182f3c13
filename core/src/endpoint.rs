//! The endpoint section every serving role shares: `[tls]`, `access_policy`, `[limits]`,
//! `metrics_listen` and `rpc_events_ms`, written at the top level of the role's config file.
//!
//! A role config holds it as `#[serde(flatten)] pub endpoint: Endpoint`, so the keys users write
//! stay where they were; [`Endpoint::validate`] is the one check of them. The role's own `listen`
//! stays in the role config (the defaults differ: a relay listens where its site's consumers
//! are); `directory` and the record's keys are the [`crate::registration`] section.
//!
//! A flattened section is read from the keys left over by the role's own fields, so the role
//! config's `deny_unknown_fields` still rejects a key neither of them knows.

use std::path::PathBuf;

use gma_proto::v1 as pb;
use serde::Deserialize;

/// Longest `rpc_events_ms` a role accepts: one day.
pub const MAX_RPC_EVENTS_MS: u64 = 86_400_000;

/// The shared settings of a served endpoint (see the module documentation).
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(default)]
pub struct Endpoint {
    /// TLS (`[tls]`: cert, key, client_ca, allow_plaintext for the endpoint; ca for the
    /// connections the role makes).
    pub tls: crate::tls::ServerTls,
    /// Authorization policy file (TOML, see [`crate::authz`]); none allows every identity.
    pub access_policy: Option<PathBuf>,
    /// Per-identity limits (`[limits]`).
    pub limits: crate::guard::Limits,
    /// Where the binary serves Prometheus `/metrics` (`--metrics-listen`); none = not served.
    pub metrics_listen: Option<String>,
    /// Period of the `gma.rpc` events the role publishes about its own RPCs (0 = none; unset =
    /// [`crate::rpc::DEFAULT_PERIOD_MS`], see [`Endpoint::rpc_events_ms`]). Unset and set to the
    /// default are told apart, so a role that publishes none can refuse the key itself.
    pub rpc_events_ms: Option<u64>,
}

impl Endpoint {
    /// The `gma.rpc` period in effect: the one set, else [`crate::rpc::DEFAULT_PERIOD_MS`].
    pub fn rpc_events_ms(&self) -> u64 {
        self.rpc_events_ms.unwrap_or(crate::rpc::DEFAULT_PERIOD_MS)
    }

    /// The one check of the shared keys; the message names the key and what to write.
    pub fn validate(&self) -> Result<(), crate::Error> {
        self.limits.validate()?;
        if self.rpc_events_ms() > MAX_RPC_EVENTS_MS {
            return Err(crate::Error::Config(format!(
                "rpc_events_ms must be within 0..={MAX_RPC_EVENTS_MS} (0 = no gma.rpc events), not {}",
                self.rpc_events_ms()
            )));
        }
        Ok(())
    }
}

/// The answer of every role's `Version` RPC: the interface, this build, and `role`.
pub fn version(role: &str) -> Result<tonic::Response<pb::VersionResponse>, tonic::Status> {
    Ok(tonic::Response::new(pb::VersionResponse {
        interface: gma_proto::INTERFACE_VERSION.into(),
        server: crate::SERVER_VERSION.into(),
        role: role.into(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields, default)]
    struct Role {
        listen: String,
        #[serde(flatten)]
        endpoint: Endpoint,
    }

    impl Default for Role {
        fn default() -> Self {
            Role {
                listen: "127.0.0.1:1".into(),
                endpoint: Endpoint::default(),
            }
        }
    }

    #[test]
    fn flattened_keys_stay_at_the_top_level() {
        let r: Role = crate::config::parse_toml(
            "listen = \"127.0.0.1:2\"\naccess_policy = \"p.toml\"\nrpc_events_ms = 500\n\
             metrics_listen = \"127.0.0.1:9\"\n[tls]\nallow_plaintext = true\n[limits]\nburst = 7\n",
            "t.toml",
        )
        .unwrap();
        assert_eq!(r.listen, "127.0.0.1:2");
        assert_eq!(r.endpoint.access_policy, Some(PathBuf::from("p.toml")));
        assert_eq!(r.endpoint.rpc_events_ms(), 500);
        assert_eq!(r.endpoint.metrics_listen.as_deref(), Some("127.0.0.1:9"));
        assert!(r.endpoint.tls.allow_plaintext);
        assert_eq!(r.endpoint.limits.burst, 7.0);
        r.endpoint.validate().unwrap();
        let d: Role = crate::config::parse_toml("", "t.toml").unwrap();
        assert_eq!(d.endpoint, Endpoint::default());
        assert_eq!(d.listen, "127.0.0.1:1");
    }

    #[test]
    fn unknown_keys_are_still_rejected_with_their_line() {
        let err =
            crate::config::parse_toml::<Role>("listen = \"a\"\n\nrpc_event_ms = 5\n", "t.toml").unwrap_err();
        let m = err.to_string();
        assert!(m.contains("unknown field `rpc_event_ms`"), "{m}");
        assert!(m.contains("line 3, column 1"), "{m}");
        let err = crate::config::parse_toml::<Role>("[limits]\nbrust = 1\n", "t.toml").unwrap_err();
        assert!(err.to_string().contains("unknown field `brust`"), "{err}");
    }

    #[test]
    fn validation_names_the_key() {
        let e = Endpoint {
            rpc_events_ms: Some(MAX_RPC_EVENTS_MS + 1),
            ..Endpoint::default()
        };
        assert!(e
            .validate()
            .unwrap_err()
            .to_string()
            .starts_with("rpc_events_ms must be within"));
        let e = Endpoint {
            limits: crate::guard::Limits {
                burst: 0.0,
                ..Default::default()
            },
            ..Endpoint::default()
        };
        assert!(e.validate().unwrap_err().to_string().contains("limits.burst"));
    }

    #[test]
    fn version_names_the_role() {
        let v = version("relay").unwrap().into_inner();
        assert_eq!(v.role, "relay");
        assert_eq!(v.interface, gma_proto::INTERFACE_VERSION);
        assert_eq!(v.server, crate::SERVER_VERSION);
    }
}
