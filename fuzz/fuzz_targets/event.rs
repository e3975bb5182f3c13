//! Self-describing wire events and schemas: `gma_core::event::from_wire` with an arbitrary
//! decoded `pb::Event` against fixed schemas (and against the input's own schema), and
//! `validate_schema` on an arbitrary decoded `pb::EventSchema`.
//!
//! Input: a 2-byte little-endian length L, then L bytes of `Event`, then the rest as an
//! `EventSchema` (a short input is all event). Oracles besides "never panics": an accepted
//! event has its schema's layout and goes back to the same values with `to_wire`; its JSON
//! line parses; a schema that validates obeys the documented rules.
#![no_main]

use gma_core::event::{from_wire, same_definition, to_json, to_wire, validate_schema, Layout, MAX_FIELDS};
use gma_core::pattern::validate_event_name;
use gma_fuzz::{assert_json, schemas, MAX_INPUT};
use gma_proto::v1::{self as pb, value::Kind};
use libfuzzer_sys::fuzz_target;
use prost::Message;

fn same_value(a: &pb::Value, b: &pb::Value) -> bool {
    match (&a.kind, &b.kind) {
        (Some(Kind::Number(x)), Some(Kind::Number(y))) => x.to_bits() == y.to_bits(),
        (Some(Kind::Text(x)), Some(Kind::Text(y))) => x == y,
        _ => false,
    }
}

fn check(e: &pb::Event, s: &pb::EventSchema) {
    let Ok(d) = from_wire(e, s) else {
        return;
    };
    let l = Layout::of(&s.fields);
    assert_eq!((d.numbers.len(), d.strings.len()), (l.doubles, l.strings));
    assert_eq!(
        (&d.name, &d.source, d.timestamp_ns),
        (&e.name, &e.source, e.timestamp_ns)
    );
    let w = to_wire(
        &d.name,
        &d.source,
        d.timestamp_ns,
        e.seq,
        &s.fields,
        &d.numbers,
        &d.strings,
    );
    assert_eq!(w.values.len(), e.values.len());
    assert!(
        w.values.iter().zip(&e.values).all(|(a, b)| same_value(a, b)),
        "to_wire(from_wire(e)) != e for schema {}",
        s.name
    );
    assert_json(&to_json(
        &d.name,
        &d.source,
        d.timestamp_ns,
        e.seq,
        &s.fields,
        &d.numbers,
        &d.strings,
    ));
}

fuzz_target!(|data: &[u8]| {
    if data.len() > MAX_INPUT {
        return;
    }
    let (ev, sc) = match data {
        [lo, hi, rest @ ..] => {
            let n = usize::from(u16::from_le_bytes([*lo, *hi])).min(rest.len());
            rest.split_at(n)
        }
        _ => (data, &[][..]),
    };
    let event = pb::Event::decode(ev).ok();
    if let Some(e) = &event {
        for s in &schemas() {
            check(e, s);
        }
    }
    let Ok(schema) = pb::EventSchema::decode(sc) else {
        return;
    };
    assert!(same_definition(&schema, &schema));
    if validate_schema(&schema).is_err() {
        return;
    }
    assert!(validate_event_name(&schema.name).is_ok());
    assert!(schema.version >= 1);
    assert!(!schema.fields.is_empty() && schema.fields.len() <= MAX_FIELDS);
    for (i, f) in schema.fields.iter().enumerate() {
        assert!(!f.name.is_empty() && f.name.len() <= 64);
        assert!(
            schema.fields[..i].iter().all(|g| g.name != f.name),
            "duplicate field {}",
            f.name
        );
        assert!(
            matches!(f.r#type, 1 | 2),
            "field {} has type {}",
            f.name,
            f.r#type
        );
    }
    if let Some(e) = &event {
        check(e, &schema);
    }
});
