//! Syntax checks of records and schemas: pure functions of the request alone.
//!
//! Checks that need the directory's contents (duplicates, known schemas, schema conflicts,
//! capacity) live in [`crate::state`]; everything here can run before a command is applied.

use gma_core::Refuse;
use std::collections::{BTreeMap, HashSet};
use std::net::Ipv6Addr;

use gma_core::event::validate_schema;
use gma_core::pattern::{validate_event_name, validate_source, Pattern};
use gma_proto::v1::{self as pb, record::Record as Body};

use crate::error::DirError;
use crate::kind::Kind;

/// Most event names one producer record may offer.
pub const MAX_EVENTS: usize = 10_000;
/// Most sources one producer record may list.
pub const MAX_SOURCES: usize = 100_000;
/// Most event patterns one consumer record may accept.
pub const MAX_ACCEPTS: usize = 10_000;
/// Most services one producer record may offer.
pub const MAX_SERVICES: usize = 64;
/// Most attributes one record may carry.
pub const MAX_ATTRIBUTES: usize = 64;
/// Longest id, address, site, org, manner, service, attribute key or value (bytes).
pub const MAX_FIELD_LEN: usize = 256;
/// Most schemas one Register/Update request may carry.
pub const MAX_SCHEMAS: usize = 10_000;

/// The record's body, kind and id, once its syntax has been checked.
pub(crate) fn record(record: Option<&pb::Record>) -> Result<(Kind, &Body), DirError> {
    let body = record.and_then(|r| r.record.as_ref()).ok_or_else(|| {
        DirError::invalid_argument("record is required: set record.producer or record.consumer")
    })?;
    match body {
        Body::Producer(p) => producer(p)?,
        Body::Consumer(c) => consumer(c)?,
    }
    Ok((Kind::of(body), body))
}

/// Checks a record id: 1–256 printable ASCII characters, no spaces.
pub(crate) fn id(kind: Kind, id: &str) -> Result<(), DirError> {
    if id.is_empty() {
        return Err(DirError::invalid_argument(format!("{kind} id is required")));
    }
    if id.len() > MAX_FIELD_LEN {
        return Err(DirError::invalid_argument(format!(
            "{kind} id is longer than {MAX_FIELD_LEN} bytes"
        )));
    }
    if let Some((i, c)) = id.char_indices().find(|(_, c)| !c.is_ascii_graphic()) {
        return Err(DirError::invalid_argument(format!(
            "{kind} id {id:?} has character {c:?} at position {i}: use printable ascii without spaces"
        )));
    }
    Ok(())
}

fn producer(p: &pb::ProducerRecord) -> Result<(), DirError> {
    let kind = Kind::Producer;
    id(kind, &p.id)?;
    address(kind, &p.id, &p.address)?;
    listed(
        kind,
        &p.id,
        "events",
        &p.events,
        MAX_EVENTS,
        "offers no events: list at least one event name",
    )?;
    each(kind, &p.id, &p.events, validate_event_name)?;
    let mut seen = HashSet::with_capacity(p.events.len());
    if let Some(e) = p.events.iter().find(|e| !seen.insert(e.as_str())) {
        return Err(DirError::invalid_argument(format!(
            "producer {} lists event {e} twice",
            p.id
        )));
    }
    count(kind, &p.id, "sources", p.sources.len(), MAX_SOURCES)?;
    each(kind, &p.id, &p.sources, validate_source)?;
    count(kind, &p.id, "services", p.services.len(), MAX_SERVICES)?;
    for s in &p.services {
        if s.is_empty() || s.len() > MAX_FIELD_LEN || !s.chars().all(|c| c.is_ascii_graphic()) {
            return Err(DirError::invalid_argument(format!(
                "producer {} has an invalid service name {s:?}: use 1-{MAX_FIELD_LEN} printable ascii characters",
                p.id
            )));
        }
    }
    text(kind, &p.id, "site", &p.site)?;
    text(kind, &p.id, "org", &p.org)?;
    attributes(kind, &p.id, &p.attributes)
}

fn consumer(c: &pb::ConsumerRecord) -> Result<(), DirError> {
    let kind = Kind::Consumer;
    id(kind, &c.id)?;
    address(kind, &c.id, &c.address)?;
    listed(
        kind,
        &c.id,
        "accepts",
        &c.accepts,
        MAX_ACCEPTS,
        "accepts no events: list at least one event pattern (\"*\" for all)",
    )?;
    each(kind, &c.id, &c.accepts, Pattern::event)?;
    text(kind, &c.id, "manner", &c.manner)?;
    text(kind, &c.id, "site", &c.site)?;
    text(kind, &c.id, "org", &c.org)?;
    attributes(kind, &c.id, &c.attributes)
}

/// A record's list of event names or patterns (`what`): at least one entry (else the error
/// `{kind} {id} {none}`), at most `max`.
fn listed(kind: Kind, id: &str, what: &str, list: &[String], max: usize, none: &str) -> Result<(), DirError> {
    if list.is_empty() {
        return Err(DirError::invalid_argument(format!("{kind} {id} {none}")));
    }
    count(kind, id, what, list.len(), max)
}

/// Checks each entry of a record's list with `check`; an error names the record
/// (`producer a: ...`).
fn each<T, E: std::fmt::Display>(
    kind: Kind,
    id: &str,
    list: &[String],
    check: impl Fn(&str) -> Result<T, E>,
) -> Result<(), DirError> {
    for entry in list {
        check(entry).map_err(|err| DirError::invalid_argument(format!("{kind} {id}: {err}")))?;
    }
    Ok(())
}

fn count(kind: Kind, id: &str, what: &str, n: usize, max: usize) -> Result<(), DirError> {
    if n > max {
        return Err(DirError::invalid_argument(format!(
            "{kind} {id} lists {n} {what}, at most {max}"
        )));
    }
    Ok(())
}

fn text(kind: Kind, id: &str, what: &str, value: &str) -> Result<(), DirError> {
    if value.len() > MAX_FIELD_LEN {
        return Err(DirError::invalid_argument(format!(
            "{kind} {id}: {what} is longer than {MAX_FIELD_LEN} bytes"
        )));
    }
    Ok(())
}

fn attributes(
    kind: Kind,
    id: &str,
    attrs: &std::collections::HashMap<String, String>,
) -> Result<(), DirError> {
    count(kind, id, "attributes", attrs.len(), MAX_ATTRIBUTES)?;
    // Sorted so the error names the same attribute every time.
    let sorted: BTreeMap<&String, &String> = attrs.iter().collect();
    for (k, v) in sorted {
        if k.is_empty() || k.len() > MAX_FIELD_LEN {
            return Err(DirError::invalid_argument(format!(
                "{kind} {id}: attribute keys must be 1-{MAX_FIELD_LEN} bytes"
            )));
        }
        if v.len() > MAX_FIELD_LEN {
            return Err(DirError::invalid_argument(format!(
                "{kind} {id}: attribute {k:?} has a value longer than {MAX_FIELD_LEN} bytes"
            )));
        }
    }
    Ok(())
}

/// Checks `http://host:port` or `https://host:port` (port required, no path).
pub(crate) fn address(kind: Kind, id: &str, addr: &str) -> Result<(), DirError> {
    check_address(addr).map_err(|why| {
        DirError::invalid_argument(format!(
            "{kind} {id} has an invalid address {:?}: {why} (expected http://host:port or https://host:port)",
            addr.chars().take(80).collect::<String>()
        ))
    })
}

fn check_address(addr: &str) -> Result<(), &'static str> {
    if addr.is_empty() {
        return Err("address is required");
    }
    if addr.len() > MAX_FIELD_LEN {
        return Err("too long");
    }
    let rest = addr
        .strip_prefix("http://")
        .or_else(|| addr.strip_prefix("https://"))
        .ok_or("unknown scheme")?;
    let (host_ok, port) = if let Some(v6) = rest.strip_prefix('[') {
        let (host, after) = v6.split_once(']').ok_or("unclosed '[' in host")?;
        (
            host.parse::<Ipv6Addr>().is_ok(),
            after.strip_prefix(':').ok_or("port required")?,
        )
    } else {
        let (host, port) = rest.rsplit_once(':').ok_or("port required")?;
        let ok = !host.is_empty()
            && host.len() <= 253
            && host
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '-' || c == '_');
        (ok, port)
    };
    if !host_ok {
        return Err("invalid host");
    }
    if port.is_empty() || !port.bytes().all(|b| b.is_ascii_digit()) {
        return Err("port must be a number (no path allowed)");
    }
    match port.parse::<u16>() {
        Ok(p) if p > 0 => Ok(()),
        _ => Err("port must be 1-65535"),
    }
}

/// Checks each schema of a request and that the request does not define one name+version twice
/// with different fields.
pub(crate) fn schemas(list: &[pb::EventSchema]) -> Result<(), DirError> {
    if list.len() > MAX_SCHEMAS {
        return Err(DirError::invalid_argument(format!(
            "request carries {} schemas, at most {MAX_SCHEMAS}",
            list.len()
        )));
    }
    let mut seen: BTreeMap<(&str, u32), &pb::EventSchema> = BTreeMap::new();
    for s in list {
        validate_schema(s).map_err(|e| DirError::invalid_argument(e.to_string()))?;
        if s.description.len() > 4096 {
            return Err(DirError::invalid_argument(format!(
                "schema {} version {}: description is longer than 4096 bytes",
                s.name, s.version
            )));
        }
        if let Some(prev) = seen.insert((s.name.as_str(), s.version), s) {
            if !gma_core::event::same_definition(prev, s) {
                return Err(DirError::invalid_argument(format!(
                    "schema {} version {} is given twice with different fields",
                    s.name, s.version
                )));
            }
        }
    }
    Ok(())
}

/// Checks a schema name for GetSchema.
pub(crate) fn schema_name(name: &str) -> Result<(), DirError> {
    validate_event_name(name).map_err(|e| DirError::invalid_argument(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses() {
        for ok in [
            "http://127.0.0.1:7001",
            "https://host-a.example.org:443",
            "http://[::1]:80",
            "http://h_1:1",
        ] {
            assert!(check_address(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "127.0.0.1:7001",
            "ftp://h:1",
            "http://h",
            "http://h:",
            "http://:80",
            "http://h:0",
            "http://h:70000",
            "http://h:80/path",
            "http://[::1:80",
            "http://[zz]:80",
            "http://h o:80",
        ] {
            assert!(check_address(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn ids() {
        assert!(id(Kind::Producer, "host-a/producer").is_ok());
        assert!(id(Kind::Producer, "").is_err());
        let e = id(Kind::Producer, "a b").unwrap_err();
        assert!(e.to_string().contains("position 1"), "{e}");
        assert!(id(Kind::Consumer, &"x".repeat(257)).is_err());
        assert!(id(Kind::Consumer, "é").is_err());
    }

    #[test]
    fn schema_lists() {
        let s = pb::EventSchema {
            name: "host.cpu".into(),
            version: 1,
            fields: vec![gma_core::event::dbl("load", "", "")],
            description: String::new(),
        };
        assert!(schemas(&[s.clone(), s.clone()]).is_ok());
        let mut other = s.clone();
        other.fields.push(gma_core::event::dbl("idle", "", ""));
        let e = schemas(&[s, other]).unwrap_err();
        assert!(e.to_string().contains("twice"), "{e}");
    }
}
