//! The registration section every role that keeps a record in the directory shares:
//! `directory`, `id`, `advertise`, `site`, `org` and `lease_ttl_ms`, written at the top level
//! of the role's config file.
//!
//! A role config holds it as `#[serde(flatten)] pub registration: Registration` (beside the
//! [`crate::endpoint::Endpoint`] section), so the keys users write stay where they were and the
//! role config's `deny_unknown_fields` still rejects a key no section knows. The defaulting the
//! roles share is written here once: the advertised address ([`Registration::address`]), the
//! record id ([`Registration::record_id`], `<source>@<address>`) and the check of the keys
//! ([`Registration::validate`]).
//!
//! The role's own `listen` and `source` stay in the role config: their defaults and types
//! differ (a relay listens where its site's consumers are; a producer's source is the host
//! name, a broker's its role name). A flattened section is read from the file alone, so a key
//! left out takes the default of [`Registration::default`] in every role.

use std::net::SocketAddr;

use serde::Deserialize;

/// Lease TTL of a role's record unless the config says otherwise, ms.
pub const DEFAULT_LEASE_TTL_MS: u64 = 10_000;
/// The lease TTLs a role accepts, ms (a directory may narrow them: it refuses a TTL outside
/// its own `min_ttl_ms..=max_ttl_ms`, by default 500..=3600000).
pub const LEASE_TTL_MS: std::ops::RangeInclusive<u64> = 100..=3_600_000;

/// Where and as what a role is registered in the directory (see the module documentation).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default)]
pub struct Registration {
    /// Directory member(s) (`a:1,b:2`) the role registers in and finds the fabric through;
    /// none = standalone (not registered).
    pub directory: Option<String>,
    /// Record id in the directory; default `<source>@<advertised address>`
    /// ([`Registration::record_id`]).
    pub id: Option<String>,
    /// Address advertised in the record; default: the bound address
    /// ([`Registration::address`]).
    pub advertise: Option<String>,
    /// Site and organization written in the record (free text; empty = none).
    pub site: String,
    pub org: String,
    /// Directory lease TTL, ms, within [`LEASE_TTL_MS`].
    pub lease_ttl_ms: u64,
}

impl Default for Registration {
    fn default() -> Self {
        Registration {
            directory: None,
            id: None,
            advertise: None,
            site: String::new(),
            org: String::new(),
            lease_ttl_ms: DEFAULT_LEASE_TTL_MS,
        }
    }
}

impl Registration {
    /// Standalone or registered in `directory`, with the defaults for the rest.
    pub fn new(directory: Option<String>) -> Registration {
        Registration {
            directory,
            ..Registration::default()
        }
    }

    /// The address written in the record: `advertise`, else the address the role is bound to
    /// ([`crate::addr::advertised`]).
    pub fn address(&self, bound: SocketAddr) -> String {
        self.advertise
            .clone()
            .unwrap_or_else(|| crate::addr::advertised(bound))
    }

    /// The directory of a role that cannot work without one (a broker, a relay, ...).
    pub fn required_directory(&self) -> Result<String, crate::Error> {
        match &self.directory {
            Some(d) if !d.trim().is_empty() => Ok(d.clone()),
            _ => Err(crate::Error::Config(
                "a directory address is required (directory in the config, or --directory)".into(),
            )),
        }
    }

    /// The record id: `id`, else [`default_id`] of `source` at `address`.
    pub fn record_id(&self, source: &str, address: &str) -> String {
        self.id.clone().unwrap_or_else(|| default_id(source, address))
    }

    /// The one check of the shared keys; the message names the key and what to write.
    pub fn validate(&self) -> Result<(), crate::Error> {
        let empty = |key: &str, v: &Option<String>| match v {
            Some(s) if s.trim().is_empty() => Err(crate::Error::Config(format!(
                "{key} is empty: give a value or leave the key out (default: {})",
                if key == "id" {
                    "<source>@<advertised address>"
                } else {
                    "the bound address"
                }
            ))),
            _ => Ok(()),
        };
        if !LEASE_TTL_MS.contains(&self.lease_ttl_ms) {
            return Err(crate::Error::Config(format!(
                "lease_ttl_ms must be within {}..={} (got {})",
                LEASE_TTL_MS.start(),
                LEASE_TTL_MS.end(),
                self.lease_ttl_ms
            )));
        }
        empty("id", &self.id)?;
        empty("advertise", &self.advertise)?;
        if matches!(&self.directory, Some(d) if d.trim().is_empty()) {
            return Err(crate::Error::Config(
                "directory is empty: give ADDR[,ADDR...] or leave the key out (standalone)".into(),
            ));
        }
        Ok(())
    }
}

/// A record id by default: `<source>@<address>`, the address without its `http://` or
/// `https://`.
pub fn default_id(source: &str, address: &str) -> String {
    let bare = address
        .trim_start_matches("http://")
        .trim_start_matches("https://");
    format!("{source}@{bare}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::endpoint::Endpoint;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields, default)]
    struct Role {
        listen: String,
        source: Option<String>,
        #[serde(flatten)]
        registration: Registration,
        #[serde(flatten)]
        endpoint: Endpoint,
    }

    impl Default for Role {
        fn default() -> Self {
            Role {
                listen: "127.0.0.1:1".into(),
                source: None,
                registration: Registration {
                    lease_ttl_ms: 3000,
                    ..Registration::default()
                },
                endpoint: Endpoint::default(),
            }
        }
    }

    #[test]
    fn flattened_keys_stay_at_the_top_level() {
        let r: Role = crate::config::parse_toml(
            "listen = \"127.0.0.1:2\"\nsource = \"h\"\ndirectory = \"127.0.0.1:7000\"\n\
             id = \"h@x\"\nadvertise = \"10.0.0.1:5\"\nsite = \"s\"\norg = \"o\"\n\
             lease_ttl_ms = 2000\nrpc_events_ms = 500\n[tls]\nallow_plaintext = true\n",
            "t.toml",
        )
        .unwrap();
        assert_eq!(r.source.as_deref(), Some("h"));
        assert_eq!(
            r.registration,
            Registration {
                directory: Some("127.0.0.1:7000".into()),
                id: Some("h@x".into()),
                advertise: Some("10.0.0.1:5".into()),
                site: "s".into(),
                org: "o".into(),
                lease_ttl_ms: 2000,
            }
        );
        assert_eq!(r.endpoint.rpc_events_ms(), 500);
        r.registration.validate().unwrap();
        // A flattened section is read from the file alone: keys left out take the section's
        // defaults, not the role's Default (which serves code that builds the config).
        let d: Role = crate::config::parse_toml("", "t.toml").unwrap();
        assert_eq!(d.registration, Registration::default());
        assert_eq!(d.listen, "127.0.0.1:1");
    }

    #[test]
    fn unknown_keys_are_still_rejected_with_their_line() {
        let err =
            crate::config::parse_toml::<Role>("site = \"s\"\n\nlease_tll_ms = 5\n", "t.toml").unwrap_err();
        let m = err.to_string();
        assert!(m.contains("unknown field `lease_tll_ms`"), "{m}");
        assert!(m.contains("line 3, column 1"), "{m}");
    }

    #[test]
    fn address_and_id_default_from_the_bound_address() {
        let bound: SocketAddr = "0.0.0.0:7001".parse().unwrap();
        let r = Registration::default();
        let address = r.address(bound);
        assert_eq!(address, "http://127.0.0.1:7001");
        assert_eq!(r.record_id("node1", &address), "node1@127.0.0.1:7001");
        assert_eq!(default_id("a", "https://h:1"), "a@h:1");
        let r = Registration {
            id: Some("mine".into()),
            advertise: Some("http://10.1.2.3:9".into()),
            ..Registration::default()
        };
        assert_eq!(r.address(bound), "http://10.1.2.3:9");
        assert_eq!(r.record_id("node1", "ignored"), "mine");
    }

    #[test]
    fn validation_names_the_key() {
        for (r, key) in [
            (
                Registration {
                    id: Some(" ".into()),
                    ..Registration::default()
                },
                "id is empty",
            ),
            (
                Registration {
                    advertise: Some(String::new()),
                    ..Registration::default()
                },
                "advertise is empty",
            ),
            (Registration::new(Some(String::new())), "directory is empty"),
            (
                Registration {
                    lease_ttl_ms: 99,
                    ..Registration::default()
                },
                "lease_ttl_ms must be within 100..=3600000 (got 99)",
            ),
        ] {
            let m = r.validate().unwrap_err().to_string();
            assert!(m.contains(key), "{m}");
        }
        Registration::new(Some("127.0.0.1:1".into())).validate().unwrap();
        let m = Registration::default()
            .required_directory()
            .unwrap_err()
            .to_string();
        assert!(m.starts_with("a directory address is required"), "{m}");
        assert_eq!(
            Registration::new(Some("a:1".into()))
                .required_directory()
                .unwrap(),
            "a:1"
        );
    }
}
