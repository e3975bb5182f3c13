//! The in-memory event model and schema rules.
//!
//! An event's values are positional per its schema. In memory (and on the wire, see
//! [`crate::codec`]) the doubles and the strings are kept apart, each in schema field order:
//! a schema `[cpu: double, iface: string, bytes: double]` gives `numbers = [cpu, bytes]`,
//! `strings = [iface]`.

use gma_proto::v1::{self as pb, value::Kind, FieldType};

use crate::pattern::{validate_event_name, validate_source, PatternError};

/// Most fields a schema may declare.
pub const MAX_FIELDS: usize = 256;
/// Longest string value accepted in an event.
pub const MAX_STRING_VALUE: usize = 4096;

/// One event, owned, in the split-values form.
#[derive(Debug, Clone, PartialEq)]
pub struct EventData {
    pub name: String,
    pub source: String,
    pub timestamp_ns: i64,
    pub numbers: Vec<f64>,
    pub strings: Vec<String>,
}

impl EventData {
    /// The wire form of this event under `fields` (its schema's), numbered `seq`.
    pub fn to_wire(&self, seq: u64, fields: &[pb::FieldSpec]) -> pb::Event {
        to_wire(
            &self.name,
            &self.source,
            self.timestamp_ns,
            seq,
            fields,
            &self.numbers,
            &self.strings,
        )
    }

    /// This event as one JSON object under `fields` (see [`to_json`]), numbered `seq`.
    pub fn to_json(&self, seq: u64, fields: &[pb::FieldSpec]) -> String {
        to_json(
            &self.name,
            &self.source,
            self.timestamp_ns,
            seq,
            fields,
            &self.numbers,
            &self.strings,
        )
    }
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SchemaError {
    #[error(transparent)]
    Name(#[from] PatternError),
    #[error("schema {name:?}: {message}")]
    Invalid { name: String, message: String },
    #[error("event {name:?} does not conform to its schema (version {version}): {message}")]
    Nonconforming {
        name: String,
        version: u32,
        message: String,
    },
    /// `timestamp_ns` outside [`crate::time::MAX_TIMESTAMP_NS`]'s range (0 is allowed: the
    /// producer's clock at Ingest).
    #[error("event {name:?}: {error}")]
    Timestamp { name: String, error: crate::Error },
}

/// Field counts of a schema, by type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Layout {
    pub doubles: usize,
    pub strings: usize,
}

impl Layout {
    pub fn of(fields: &[pb::FieldSpec]) -> Layout {
        let mut l = Layout::default();
        for f in fields {
            if f.r#type() == FieldType::String {
                l.strings += 1;
            } else {
                l.doubles += 1;
            }
        }
        l
    }
}

/// Checks a schema is well formed: a valid name, version >= 1, unique non-empty field names,
/// each with a known type.
pub fn validate_schema(s: &pb::EventSchema) -> Result<(), SchemaError> {
    validate_event_name(&s.name)?;
    let bad = |m: String| SchemaError::Invalid {
        name: s.name.clone(),
        message: m,
    };
    if s.version == 0 {
        return Err(bad("version must be >= 1".into()));
    }
    if s.fields.is_empty() {
        return Err(bad("declares no fields".into()));
    }
    if s.fields.len() > MAX_FIELDS {
        return Err(bad(format!(
            "declares {} fields, at most {MAX_FIELDS}",
            s.fields.len()
        )));
    }
    let mut seen = std::collections::HashSet::new();
    for (i, f) in s.fields.iter().enumerate() {
        if f.name.is_empty()
            || f.name.len() > 64
            || !f.name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        {
            return Err(bad(format!(
                "field {i} has an invalid name {:?} (1-64 of letters, digits, '_')",
                f.name
            )));
        }
        if !seen.insert(f.name.as_str()) {
            return Err(bad(format!("field {:?} declared twice", f.name)));
        }
        match FieldType::try_from(f.r#type) {
            Ok(FieldType::Double) | Ok(FieldType::String) => {}
            _ => {
                return Err(bad(format!(
                    "field {:?} has no valid type (double or string)",
                    f.name
                )))
            }
        }
    }
    Ok(())
}

/// Two schemas with the same name and version must be identical (the directory rejects a
/// different definition under an existing version).
pub fn same_definition(a: &pb::EventSchema, b: &pb::EventSchema) -> bool {
    a.name == b.name && a.version == b.version && a.fields == b.fields
}

/// Converts a self-describing wire event to [`EventData`] checking it against `schema`.
/// `timestamp_ns` must be 0 (the producer's clock) or valid ([`crate::time::check_timestamp_ns`]).
pub fn from_wire(e: &pb::Event, schema: &pb::EventSchema) -> Result<EventData, SchemaError> {
    validate_source(&e.source)?;
    if e.timestamp_ns != 0 {
        crate::time::check_timestamp_ns(e.timestamp_ns).map_err(|error| SchemaError::Timestamp {
            name: e.name.clone(),
            error,
        })?;
    }
    let nonconf = |m: String| SchemaError::Nonconforming {
        name: e.name.clone(),
        version: schema.version,
        message: m,
    };
    if e.values.len() != schema.fields.len() {
        return Err(nonconf(format!(
            "{} values for {} fields",
            e.values.len(),
            schema.fields.len()
        )));
    }
    let layout = Layout::of(&schema.fields);
    let mut numbers = Vec::with_capacity(layout.doubles);
    let mut strings = Vec::with_capacity(layout.strings);
    for (f, v) in schema.fields.iter().zip(&e.values) {
        match (f.r#type(), &v.kind) {
            (FieldType::String, Some(Kind::Text(t))) => {
                if t.len() > MAX_STRING_VALUE {
                    return Err(nonconf(format!(
                        "field {:?} longer than {MAX_STRING_VALUE} bytes",
                        f.name
                    )));
                }
                strings.push(t.clone())
            }
            (FieldType::String, _) => return Err(nonconf(format!("field {:?} must be a string", f.name))),
            (_, Some(Kind::Number(n))) => numbers.push(*n),
            (_, _) => return Err(nonconf(format!("field {:?} must be a number", f.name))),
        }
    }
    Ok(EventData {
        name: e.name.clone(),
        source: e.source.clone(),
        timestamp_ns: e.timestamp_ns,
        numbers,
        strings,
    })
}

/// Converts split values back to the positional self-describing form.
pub fn to_wire(
    name: &str,
    source: &str,
    timestamp_ns: i64,
    seq: u64,
    fields: &[pb::FieldSpec],
    numbers: &[f64],
    strings: &[String],
) -> pb::Event {
    let (mut ni, mut si) = (0, 0);
    let values = fields
        .iter()
        .map(|f| {
            let kind = if f.r#type() == FieldType::String {
                si += 1;
                Kind::Text(strings.get(si - 1).cloned().unwrap_or_default())
            } else {
                ni += 1;
                Kind::Number(numbers.get(ni - 1).copied().unwrap_or(f64::NAN))
            };
            pb::Value { kind: Some(kind) }
        })
        .collect();
    pb::Event {
        name: name.to_string(),
        source: source.to_string(),
        timestamp_ns,
        seq,
        values,
    }
}

/// Renders an event as the readable JSON object the CLI prints:
/// `{"name","source","timestamp_ns","seq","values":{field: value}}`.
pub fn to_json(
    name: &str,
    source: &str,
    timestamp_ns: i64,
    seq: u64,
    fields: &[pb::FieldSpec],
    numbers: &[f64],
    strings: &[String],
) -> String {
    let mut out = String::with_capacity(128);
    out.push_str("{\"name\":");
    push_json_str(&mut out, name);
    out.push_str(",\"source\":");
    push_json_str(&mut out, source);
    out.push_str(&format!(
        ",\"timestamp_ns\":{timestamp_ns},\"seq\":{seq},\"values\":{{"
    ));
    let (mut ni, mut si) = (0, 0);
    for (i, f) in fields.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        push_json_str(&mut out, &f.name);
        out.push(':');
        if f.r#type() == FieldType::String {
            push_json_str(&mut out, strings.get(si).map(String::as_str).unwrap_or(""));
            si += 1;
        } else {
            let v = numbers.get(ni).copied().unwrap_or(f64::NAN);
            ni += 1;
            if v.is_finite() {
                // Plain digits for everyday magnitudes; an exponent for huge and tiny ones so the
                // text stays short and every JSON parser reads it back (found by fuzzing).
                let a = v.abs();
                if a != 0.0 && !(1e-6..1e16).contains(&a) {
                    out.push_str(&format!("{v:e}"));
                } else {
                    out.push_str(&format!("{v}"));
                }
            } else {
                out.push_str("null");
            }
        }
    }
    out.push_str("}}");
    out
}

/// Appends `s` as a JSON string literal.
pub fn push_json_str(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

/// The version of every schema the fabric defines in code.
pub const SCHEMA_VERSION: u32 = 1;

/// A schema defined in code, at [`SCHEMA_VERSION`]: `fields` in order (doubles go in an event's
/// `numbers`, strings in its `strings`, each in this order), made with [`dbl`] and [`text`].
pub fn schema(name: &str, description: &str, fields: Vec<pb::FieldSpec>) -> pb::EventSchema {
    pb::EventSchema {
        name: name.to_string(),
        version: SCHEMA_VERSION,
        fields,
        description: description.to_string(),
    }
}

/// A schema's contract in one line: name, version, then each field's name, type and unit in
/// order (`host.net v1: rx_bytes_per_s double B/s, ..., iface string`). What a reader of the
/// events depends on; descriptions are left out. Tests pin schemas with it.
pub fn signature(s: &pb::EventSchema) -> String {
    let fields: Vec<String> = s
        .fields
        .iter()
        .map(|f| {
            let ty = match FieldType::try_from(f.r#type) {
                Ok(FieldType::Double) => "double".to_string(),
                Ok(FieldType::String) => "string".to_string(),
                _ => format!("type{}", f.r#type),
            };
            [f.name.as_str(), &ty, &f.unit]
                .iter()
                .filter(|p| !p.is_empty())
                .copied()
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect();
    format!("{} v{}: {}", s.name, s.version, fields.join(", "))
}

/// Shorthand for building schemas in code.
pub fn field(name: &str, ty: FieldType, unit: &str, description: &str) -> pb::FieldSpec {
    pb::FieldSpec {
        name: name.to_string(),
        r#type: ty as i32,
        unit: unit.to_string(),
        description: description.to_string(),
    }
}

/// A double field.
pub fn dbl(name: &str, unit: &str, description: &str) -> pb::FieldSpec {
    field(name, FieldType::Double, unit, description)
}

/// A string field.
pub fn text(name: &str, description: &str) -> pb::FieldSpec {
    field(name, FieldType::String, "", description)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schema() -> pb::EventSchema {
        pb::EventSchema {
            name: "host.net".into(),
            version: 1,
            fields: vec![dbl("rx", "B/s", ""), text("iface", ""), dbl("tx", "B/s", "")],
            description: String::new(),
        }
    }

    #[test]
    fn schema_validation() {
        assert!(validate_schema(&schema()).is_ok());
        let mut s = schema();
        s.version = 0;
        assert!(validate_schema(&s).is_err());
        let mut s = schema();
        s.fields.push(dbl("rx", "", ""));
        assert!(validate_schema(&s)
            .unwrap_err()
            .to_string()
            .contains("declared twice"));
        let mut s = schema();
        s.fields[0].r#type = 0;
        assert!(validate_schema(&s).is_err());
        let mut s = schema();
        s.name = "bad name".into();
        assert!(validate_schema(&s).is_err());
    }

    #[test]
    fn wire_round_trip_and_conformance() {
        let s = schema();
        let w = to_wire(
            "host.net",
            "a/eth0",
            5,
            9,
            &s.fields,
            &[1.0, 2.0],
            &["eth0".into()],
        );
        let d = from_wire(&w, &s).unwrap();
        assert_eq!(d.numbers, vec![1.0, 2.0]);
        assert_eq!(d.strings, vec!["eth0".to_string()]);
        let mut bad = w.clone();
        bad.values.pop();
        assert!(matches!(
            from_wire(&bad, &s),
            Err(SchemaError::Nonconforming { .. })
        ));
        let mut bad = w;
        bad.values[1] = pb::Value {
            kind: Some(Kind::Number(1.0)),
        };
        assert!(from_wire(&bad, &s)
            .unwrap_err()
            .to_string()
            .contains("must be a string"));
    }

    #[test]
    fn json_rendering() {
        let s = schema();
        let j = to_json(
            "host.net",
            "a\"b",
            1,
            2,
            &s.fields,
            &[1.5, f64::NAN],
            &["lo".into()],
        );
        assert_eq!(
            j,
            r#"{"name":"host.net","source":"a\"b","timestamp_ns":1,"seq":2,"values":{"rx":1.5,"iface":"lo","tx":null}}"#
        );
    }
}
