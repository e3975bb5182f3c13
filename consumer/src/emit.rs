//! Application sensors: any program pushes its own events into a producer through the
//! producer's `Ingest` service, and they are served to consumers like the host sensors' events.
//!
//! Fields are given by name; the [`Emitter`] puts them in the order of the event's schema. The
//! schema is the one this program registered, else the one the producer already holds, else one
//! inferred from the first event sent (numbers become DOUBLE fields, text STRING fields, in the
//! order given, version 1).
//!
//! ```no_run
//! # async fn demo() -> Result<(), gma_consumer::ConsumerError> {
//! use gma_consumer::emit::{Emitter, FieldValue};
//!
//! let mut em = Emitter::connect("127.0.0.1:7001").await?;
//! let fields = [("queued", FieldValue::from(12)), ("state", FieldValue::from("draining"))];
//! let seq = em.emit("app.jobs", "worker-3", 0, &fields).await?; // timestamp 0 = now
//! println!("seq {seq}");
//! # Ok(()) }
//! ```

use std::collections::{HashMap, HashSet};

use gma_core::event::SchemaError;
use gma_proto::v1 as pb;
use pb::ingest_client::IngestClient;
use pb::value::Kind;
use pb::FieldType;
use tonic::transport::Channel;

use crate::ConsumerError;

/// Most events one Push request may carry (the producer's limit); [`Emitter::queue`] sends a
/// full batch on its own.
pub const MAX_PUSH_EVENTS: usize = 10_000;

/// The value of one field of an event.
#[derive(Debug, Clone, PartialEq)]
pub enum FieldValue {
    /// For a DOUBLE field; for a STRING field it is sent as its decimal text.
    Number(f64),
    /// For a STRING field; for a DOUBLE field it must parse as a number.
    Text(String),
}

impl From<f64> for FieldValue {
    fn from(v: f64) -> Self {
        FieldValue::Number(v)
    }
}

impl From<i32> for FieldValue {
    fn from(v: i32) -> Self {
        FieldValue::Number(f64::from(v))
    }
}

impl From<i64> for FieldValue {
    fn from(v: i64) -> Self {
        FieldValue::Number(v as f64)
    }
}

impl From<u64> for FieldValue {
    fn from(v: u64) -> Self {
        FieldValue::Number(v as f64)
    }
}

impl From<&str> for FieldValue {
    fn from(v: &str) -> Self {
        FieldValue::Text(v.to_string())
    }
}

impl From<String> for FieldValue {
    fn from(v: String) -> Self {
        FieldValue::Text(v)
    }
}

/// Where a cached schema came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Origin {
    /// Held by the producer already (someone else's): never sent back.
    Producer,
    /// Given to [`Emitter::register`]: sent along with its events, never forgotten.
    Registered,
    /// Inferred here from an event: sent along with its events, forgotten if a push fails.
    Inferred,
}

/// One connection to a producer's `Ingest` service, with a cache of event schemas and a queue
/// of events not yet sent.
///
/// Schemas this program defined (registered or inferred) are sent along with their events, so
/// a restarted producer learns them again. After a failed push, schemas not registered through
/// [`Emitter::register`] are forgotten and looked up again on the next event.
pub struct Emitter {
    addr: String,
    client: IngestClient<Channel>,
    schemas: HashMap<String, (pb::EventSchema, Origin)>,
    allow_missing: bool,
    queued: Vec<pb::Event>,
    last_seq: u64,
}

impl Emitter {
    /// Connects to the producer at `producer_addr` (`host:port` or `http://host:port`).
    pub async fn connect(producer_addr: &str) -> Result<Emitter, ConsumerError> {
        let ch = crate::connect(producer_addr).await?;
        Ok(Emitter {
            addr: producer_addr.to_string(),
            client: IngestClient::new(ch),
            schemas: HashMap::new(),
            allow_missing: false,
            queued: Vec::new(),
            last_seq: 0,
        })
    }

    /// With `true`, a field the schema has but an event lacks is sent as NaN (DOUBLE) or ""
    /// (STRING) instead of being an error. Off by default.
    pub fn set_allow_missing(&mut self, allow: bool) {
        self.allow_missing = allow;
    }

    /// Registers (or confirms) the schema of events this program will send. Fails if the
    /// producer holds a different definition under the same or a higher version.
    pub async fn register(&mut self, schema: pb::EventSchema) -> Result<(), ConsumerError> {
        let req = pb::IngestRequest {
            events: vec![],
            schemas: vec![schema.clone()],
        };
        self.client
            .push(req)
            .await
            .map_err(|s| ConsumerError::Rpc(format!("register {} with {}", schema.name, self.addr), s))?;
        self.schemas
            .insert(schema.name.clone(), (schema, Origin::Registered));
        Ok(())
    }

    /// The schema events named `name` are sent with: from the cache, else from the producer.
    /// `None` when neither has one (the next event of that name will define it).
    pub async fn schema(&mut self, name: &str) -> Result<Option<pb::EventSchema>, ConsumerError> {
        if let Some((s, _)) = self.schemas.get(name) {
            return Ok(Some(s.clone()));
        }
        gma_core::pattern::validate_event_name(name).map_err(|e| ConsumerError::Invalid(e.to_string()))?;
        let req = pb::GetSchemaRequest {
            name: name.to_string(),
            version: 0,
        };
        match self.client.schema(req).await {
            Ok(r) => match r.into_inner().schema {
                Some(s) => {
                    self.schemas
                        .insert(name.to_string(), (s.clone(), Origin::Producer));
                    Ok(Some(s))
                }
                None => Err(ConsumerError::Protocol(
                    self.addr.clone(),
                    format!("Ingest.Schema answered without a schema for {name}"),
                )),
            },
            Err(s) if s.code() == tonic::Code::NotFound => Ok(None),
            Err(s) => Err(ConsumerError::Rpc(
                format!("schema of {name} from {}", self.addr),
                s,
            )),
        }
    }

    /// Sends one event at once (after any queued events) and returns the seq the producer gave
    /// it. `fields` are name -> value pairs in any order; `timestamp_ns` 0 means "now" on the
    /// producer's clock.
    ///
    /// Errors, all before anything is sent: a field the schema lacks (the message names the
    /// schema's fields), a missing field unless [`Emitter::set_allow_missing`] (naming the
    /// missing fields and the schema's fields), a field given twice, a text value for a DOUBLE
    /// field that is not a number, or no fields at all for an event name without a schema.
    pub async fn emit<S: AsRef<str>>(
        &mut self,
        name: &str,
        source: &str,
        timestamp_ns: i64,
        fields: &[(S, FieldValue)],
    ) -> Result<u64, ConsumerError> {
        self.queue(name, source, timestamp_ns, fields).await?;
        self.flush().await
    }

    /// Like [`Emitter::emit`] but only queues the event; [`Emitter::flush`] sends the queue in
    /// one request. A queue that reaches [`MAX_PUSH_EVENTS`] is sent at once (an error then is
    /// that of [`Emitter::flush`]).
    pub async fn queue<S: AsRef<str>>(
        &mut self,
        name: &str,
        source: &str,
        timestamp_ns: i64,
        fields: &[(S, FieldValue)],
    ) -> Result<(), ConsumerError> {
        let (schema, inferred) = match self.schema(name).await? {
            Some(schema) => (schema, false),
            None => (infer_schema(name, fields)?, true),
        };
        let event = pb::Event {
            name: name.to_string(),
            source: source.to_string(),
            timestamp_ns,
            seq: 0,
            values: values_for(&schema, fields, self.allow_missing && !inferred)?,
        };
        // The producer's own checks (source, string lengths), so that a refused event does not
        // leave an inferred schema registered on the producer.
        gma_core::event::from_wire(&event, &schema).map_err(|e| match e {
            SchemaError::Nonconforming { .. } => ConsumerError::Invalid(e.to_string()),
            _ => invalid(name, e.to_string()),
        })?;
        if inferred {
            self.schemas.insert(name.to_string(), (schema, Origin::Inferred));
        }
        self.queued.push(event);
        if self.queued.len() >= MAX_PUSH_EVENTS {
            self.flush().await?;
        }
        Ok(())
    }

    /// Events queued and not yet sent.
    pub fn queued(&self) -> usize {
        self.queued.len()
    }

    /// The seq of the last event the producer accepted from this emitter (0 before any).
    pub fn last_seq(&self) -> u64 {
        self.last_seq
    }

    /// Sends the queued events (in requests of at most [`MAX_PUSH_EVENTS`]) and returns the seq
    /// of the last one, or 0 if none was queued. The queue is empty afterwards even on error:
    /// the producer checks a request's events together before storing any, so those of the
    /// failed request (and of any after it) were not stored.
    pub async fn flush(&mut self) -> Result<u64, ConsumerError> {
        let queued = std::mem::take(&mut self.queued);
        let mut last_seq = 0;
        for chunk in queued.chunks(MAX_PUSH_EVENTS) {
            let names: HashSet<&str> = chunk.iter().map(|e| e.name.as_str()).collect();
            let schemas = names
                .iter()
                .filter_map(|n| self.schemas.get(*n))
                .filter(|(_, origin)| *origin != Origin::Producer)
                .map(|(s, _)| s.clone())
                .collect();
            let req = pb::IngestRequest {
                events: chunk.to_vec(),
                schemas,
            };
            match self.client.push(req).await {
                Ok(r) => {
                    last_seq = r.into_inner().last_seq;
                    self.last_seq = last_seq;
                }
                Err(s) => {
                    // The cached schema may be why (e.g. the producer now holds a newer one).
                    self.schemas.retain(|n, (_, origin)| {
                        *origin == Origin::Registered || !names.contains(n.as_str())
                    });
                    return Err(ConsumerError::Rpc(format!("push to {}", self.addr), s));
                }
            }
        }
        Ok(last_seq)
    }
}

fn invalid(name: &str, message: String) -> ConsumerError {
    ConsumerError::Invalid(format!("event {name}: {message}"))
}

fn field_list(schema: &pb::EventSchema) -> String {
    let names: Vec<&str> = schema.fields.iter().map(|f| f.name.as_str()).collect();
    format!(
        "schema version {} has fields {}",
        schema.version,
        names.join(", ")
    )
}

/// The schema inferred from the first event of a name: its fields in the order given, numbers
/// DOUBLE and text STRING, version 1.
fn infer_schema<S: AsRef<str>>(
    name: &str,
    fields: &[(S, FieldValue)],
) -> Result<pb::EventSchema, ConsumerError> {
    if fields.is_empty() {
        return Err(invalid(
            name,
            "the producer has no schema for it and the event has no fields to infer one from".into(),
        ));
    }
    let schema = pb::EventSchema {
        name: name.to_string(),
        version: 1,
        fields: fields
            .iter()
            .map(|(f, v)| pb::FieldSpec {
                name: f.as_ref().to_string(),
                r#type: match v {
                    FieldValue::Number(_) => FieldType::Double,
                    FieldValue::Text(_) => FieldType::String,
                } as i32,
                unit: String::new(),
                description: String::new(),
            })
            .collect(),
        description: String::new(),
    };
    gma_core::event::validate_schema(&schema)
        .map_err(|e| invalid(name, format!("cannot infer a schema: {e}")))?;
    Ok(schema)
}

/// The positional values of an event for `schema`, from name -> value pairs.
fn values_for<S: AsRef<str>>(
    schema: &pb::EventSchema,
    fields: &[(S, FieldValue)],
    allow_missing: bool,
) -> Result<Vec<pb::Value>, ConsumerError> {
    let name = schema.name.as_str();
    let mut given: HashMap<&str, &FieldValue> = HashMap::with_capacity(fields.len());
    let mut unknown = Vec::new();
    for (f, v) in fields {
        let f = f.as_ref();
        if given.insert(f, v).is_some() {
            return Err(invalid(name, format!("field {f} given twice")));
        }
        if !schema.fields.iter().any(|s| s.name == f) {
            unknown.push(f);
        }
    }
    if !unknown.is_empty() {
        return Err(invalid(
            name,
            format!("unknown field(s) {} ({})", unknown.join(", "), field_list(schema)),
        ));
    }
    let missing: Vec<&str> = schema
        .fields
        .iter()
        .filter(|f| !given.contains_key(f.name.as_str()))
        .map(|f| f.name.as_str())
        .collect();
    if !missing.is_empty() && !allow_missing {
        return Err(invalid(
            name,
            format!(
                "missing field(s) {} ({}; or allow missing fields)",
                missing.join(", "),
                field_list(schema)
            ),
        ));
    }
    schema
        .fields
        .iter()
        .map(|f| {
            let string = f.r#type() == FieldType::String;
            let kind = match (given.get(f.name.as_str()), string) {
                (None, true) => Kind::Text(String::new()),
                (None, false) => Kind::Number(f64::NAN),
                (Some(FieldValue::Text(t)), true) => Kind::Text(t.clone()),
                (Some(FieldValue::Number(n)), true) => Kind::Text(n.to_string()),
                (Some(FieldValue::Number(n)), false) => Kind::Number(*n),
                (Some(FieldValue::Text(t)), false) => Kind::Number(t.trim().parse().map_err(|_| {
                    invalid(
                        name,
                        format!("field {} is a number (DOUBLE) but {t:?} is not a number", f.name),
                    )
                })?),
            };
            Ok(pb::Value { kind: Some(kind) })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fv(pairs: &[(&str, FieldValue)]) -> Vec<(String, FieldValue)> {
        pairs.iter().map(|(n, v)| (n.to_string(), v.clone())).collect()
    }

    fn schema() -> pb::EventSchema {
        infer_schema(
            "app.job",
            &fv(&[("load", 1.0.into()), ("state", "ok".into()), ("free", 2.into())]),
        )
        .unwrap()
    }

    fn kinds(v: Vec<pb::Value>) -> Vec<Kind> {
        v.into_iter().map(|v| v.kind.unwrap()).collect()
    }

    #[test]
    fn emit_infers_types_in_order_given() {
        let s = schema();
        assert_eq!(s.name, "app.job");
        assert_eq!(s.version, 1);
        let got: Vec<(&str, FieldType)> = s.fields.iter().map(|f| (f.name.as_str(), f.r#type())).collect();
        assert_eq!(
            got,
            vec![
                ("load", FieldType::Double),
                ("state", FieldType::String),
                ("free", FieldType::Double)
            ]
        );
    }

    #[test]
    fn emit_inference_rejects_empty_and_bad_names() {
        let e = infer_schema::<&str>("app.job", &[]).unwrap_err().to_string();
        assert!(e.contains("no fields to infer"), "{e}");
        let e = infer_schema("app.job", &fv(&[("bad-name", 1.0.into())]))
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("event app.job: cannot infer a schema"), "{e}");
        assert!(e.contains("bad-name"), "{e}");
    }

    #[test]
    fn emit_puts_fields_in_schema_order() {
        let v = values_for(
            &schema(),
            &fv(&[
                ("free", "3".into()),
                ("state", "busy".into()),
                ("load", 0.5.into()),
            ]),
            false,
        )
        .unwrap();
        assert_eq!(
            kinds(v),
            vec![Kind::Number(0.5), Kind::Text("busy".into()), Kind::Number(3.0)]
        );
        // A number for a STRING field is sent as its text.
        let v = values_for(
            &schema(),
            &fv(&[("free", 1.into()), ("state", 7.into()), ("load", 2.5.into())]),
            false,
        )
        .unwrap();
        assert_eq!(kinds(v)[1], Kind::Text("7".into()));
    }

    #[test]
    fn emit_missing_fields() {
        let fields = fv(&[("state", "x".into())]);
        let e = values_for(&schema(), &fields, false).unwrap_err().to_string();
        assert_eq!(
            e,
            "event app.job: missing field(s) load, free (schema version 1 has fields load, state, free; \
             or allow missing fields)"
        );
        let k = kinds(values_for(&schema(), &fv(&[("free", 1.into())]), true).unwrap());
        assert!(matches!(k[0], Kind::Number(n) if n.is_nan()));
        assert_eq!(k[1], Kind::Text(String::new()));
        assert_eq!(k[2], Kind::Number(1.0));
    }

    #[test]
    fn emit_unknown_duplicate_and_bad_number() {
        let e = values_for(
            &schema(),
            &fv(&[("lod", 1.0.into()), ("colour", "red".into())]),
            true,
        )
        .unwrap_err()
        .to_string();
        assert_eq!(
            e,
            "event app.job: unknown field(s) lod, colour (schema version 1 has fields load, state, free)"
        );
        let e = values_for(
            &schema(),
            &fv(&[("load", 1.0.into()), ("load", 2.0.into())]),
            true,
        )
        .unwrap_err()
        .to_string();
        assert_eq!(e, "event app.job: field load given twice");
        let e = values_for(&schema(), &fv(&[("load", "high".into())]), true)
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "event app.job: field load is a number (DOUBLE) but \"high\" is not a number"
        );
    }
}
