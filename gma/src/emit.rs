//! `gma emit`: push application events into a producer (its `Ingest` service), one from the
//! command line or many from standard input.

use anyhow::{anyhow, bail};
use clap::Args;
use gma_consumer::emit::{Emitter, FieldValue};
use gma_consumer::ConsumerError;

#[derive(Args, Debug)]
pub struct EmitArgs {
    /// Event name, e.g. app.jobs (not with --stdin).
    #[arg(required_unless_present = "stdin")]
    pub name: Option<String>,
    /// field=value pairs: `load=3.5` is a number, `state=busy` text; `field:s=123` forces text and
    /// `field:n=VALUE` a number (the types matter only when the event's schema is inferred).
    pub fields: Vec<String>,
    /// The producer to push into.
    #[arg(long)]
    pub producer: String,
    /// Source of the events (default: this host's name).
    #[arg(long)]
    pub source: Option<String>,
    /// Event time: RFC 3339 (2024-05-01T12:00:00.5Z, 2024-05-01T14:00:00+02:00), `now` (the
    /// producer's clock), @UNIX_SECONDS or integer nanoseconds since the Unix epoch.
    #[arg(long, default_value = "now")]
    pub time: String,
    /// Send fields the schema has but the event lacks as NaN (number) or "" (text).
    #[arg(long)]
    pub allow_missing: bool,
    /// Read events from standard input, one per line: `NAME field=value ...` (blank lines and
    /// lines starting with # are skipped); send them in batches; print the count at the end.
    #[arg(long, conflicts_with_all = ["name", "fields"])]
    pub stdin: bool,
}

/// A value as typed on the command line.
#[derive(Debug, Clone, PartialEq)]
enum Raw {
    /// `field=value`: a number if it looks like one, else text (when the type is inferred).
    Auto(String),
    /// `field:s=value`.
    Text(String),
    /// `field:n=value`.
    Number(f64),
}

fn parse_number(s: &str) -> Option<f64> {
    s.trim().parse().ok()
}

/// Parses `field=value`, `field:s=value` or `field:n=value`.
fn parse_field(token: &str) -> anyhow::Result<(String, Raw)> {
    let Some((key, value)) = token.split_once('=') else {
        bail!("{token:?}: expected field=value (or field:s=text, field:n=number)");
    };
    let (field, raw) = match key.rsplit_once(':') {
        Some((f, "s")) => (f, Raw::Text(value.to_string())),
        Some((f, "n")) => match parse_number(value) {
            Some(n) => (f, Raw::Number(n)),
            None => bail!("{token:?}: {value:?} is not a number"),
        },
        Some((_, t)) => bail!("{token:?}: unknown type :{t} (use :s for text or :n for a number)"),
        None => (key, Raw::Auto(value.to_string())),
    };
    if field.is_empty() {
        bail!("{token:?}: no field name before '='");
    }
    Ok((field.to_string(), raw))
}

/// True when an untyped value is taken as a number: it parses as one and has a digit (so
/// `nan`, `inf` stay text; use `:n` for those).
fn looks_numeric(v: &str) -> bool {
    v.bytes().any(|b| b.is_ascii_digit()) && parse_number(v).is_some()
}

/// Turns typed-in values into field values. With a known schema an untyped value goes as text
/// (the emitter parses it for number fields and keeps it exact for text fields); without one,
/// its look decides the inferred type.
fn field_values(fields: Vec<(String, Raw)>, has_schema: bool) -> Vec<(String, FieldValue)> {
    fields
        .into_iter()
        .map(|(f, raw)| {
            let v = match raw {
                Raw::Text(t) => FieldValue::Text(t),
                Raw::Number(n) => FieldValue::Number(n),
                Raw::Auto(t) if !has_schema && looks_numeric(&t) => {
                    FieldValue::Number(parse_number(&t).unwrap_or(f64::NAN))
                }
                Raw::Auto(t) => FieldValue::Text(t),
            };
            (f, v)
        })
        .collect()
}

/// Parses `--time`: `now` (0: the producer's clock), @UNIX_SECONDS[.fraction], integer
/// nanoseconds, or RFC 3339. Times at or before the epoch, or after 2262, are refused.
fn parse_time(s: &str) -> anyhow::Result<i64> {
    let bad = || {
        anyhow!(
            "--time {s:?}: expected now, RFC 3339 (e.g. 2024-05-01T12:00:00Z), @UNIX_SECONDS or integer \
             nanoseconds"
        )
    };
    let ns = if s == "now" {
        return Ok(0);
    } else if let Some(secs) = s.strip_prefix('@') {
        let (whole, frac) = secs.split_once('.').unwrap_or((secs, ""));
        if whole.is_empty()
            || !whole.bytes().all(|b| b.is_ascii_digit())
            || frac.len() > 9
            || !frac.bytes().all(|b| b.is_ascii_digit())
        {
            return Err(bad());
        }
        let whole: i64 = whole.parse().map_err(|_| bad())?;
        let frac: i64 = if frac.is_empty() {
            0
        } else {
            frac.parse::<i64>().map_err(|_| bad())? * 10i64.pow(9 - frac.len() as u32)
        };
        whole.checked_mul(1_000_000_000).and_then(|n| n.checked_add(frac))
    } else if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) {
        s.parse::<i64>().ok()
    } else {
        gma_core::time::parse_rfc3339(s).ok_or_else(bad)?
    };
    match ns {
        Some(n) if n > 0 => Ok(n),
        Some(_) => bail!("--time {s:?}: must be after 1970-01-01T00:00:00Z"),
        None => bail!("--time {s:?}: out of range (at most year 2262)"),
    }
}

/// One line for an error of the emitter.
fn emit_err(e: ConsumerError) -> anyhow::Error {
    match &e {
        ConsumerError::Rpc(what, s) => anyhow!("{what}: {} ({:?})", s.message(), s.code()),
        _ => anyhow!("{e}"),
    }
}

/// Field values for an event of `name`, typed against its schema if there is one.
async fn resolve(em: &mut Emitter, name: &str, tokens: &[&str]) -> anyhow::Result<Vec<(String, FieldValue)>> {
    let fields = tokens
        .iter()
        .map(|t| parse_field(t))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let has_schema = em.schema(name).await.map_err(emit_err)?.is_some();
    Ok(field_values(fields, has_schema))
}

pub async fn run(a: EmitArgs) -> anyhow::Result<()> {
    let timestamp_ns = parse_time(&a.time)?;
    let source = a.source.clone().unwrap_or_else(gma_producer::host_name);
    if !a.stdin {
        // Refuse malformed arguments before connecting.
        for t in &a.fields {
            parse_field(t)?;
        }
    }
    let mut em = Emitter::connect(&a.producer).await.map_err(emit_err)?;
    em.set_allow_missing(a.allow_missing);
    if a.stdin {
        return from_stdin(&mut em, &source, timestamp_ns).await;
    }
    let Some(name) = &a.name else {
        bail!("give an event name, or --stdin");
    };
    let tokens: Vec<&str> = a.fields.iter().map(String::as_str).collect();
    let fields = resolve(&mut em, name, &tokens).await?;
    let seq = em
        .emit(name, &source, timestamp_ns, &fields)
        .await
        .map_err(emit_err)?;
    println!("seq {seq}");
    Ok(())
}

/// Reads `NAME field=value ...` lines; sends what has arrived whenever input pauses (or a
/// request is full), so a slow pipeline is not held back and a fast one is batched.
async fn from_stdin(em: &mut Emitter, source: &str, timestamp_ns: i64) -> anyhow::Result<()> {
    let (tx, mut rx) = tokio::sync::mpsc::channel::<std::io::Result<String>>(1024);
    std::thread::spawn(move || {
        for line in std::io::stdin().lines() {
            let stop = line.is_err();
            if tx.blocking_send(line).is_err() || stop {
                break;
            }
        }
    });
    let (mut sent, mut line_no) = (0u64, 0u64);
    while let Some(first) = rx.recv().await {
        let mut next = Some(first);
        while let Some(line) = next.take() {
            line_no += 1;
            let before = em.queued() as u64;
            if let Err(e) = queue_line(em, line, source, timestamp_ns).await {
                // Send what came before the bad line (unless a full request just failed, which
                // empties the queue), then stop.
                let n = em.queued() as u64;
                if n > 0 && em.flush().await.is_ok() {
                    sent += n;
                }
                bail!("line {line_no}: {e:#} ({sent} {} sent before it)", plural(sent));
            }
            if (em.queued() as u64) < before {
                // queue() sent a full request, this event included.
                sent += before + 1;
            }
            next = rx.try_recv().ok();
        }
        let n = em.queued() as u64;
        if n > 0 {
            if let Err(e) = em.flush().await {
                bail!("{:#} ({sent} {} sent before)", emit_err(e), plural(sent));
            }
            sent += n;
        }
    }
    println!("sent {sent} {} (last seq {})", plural(sent), em.last_seq());
    Ok(())
}

fn plural(n: u64) -> &'static str {
    if n == 1 {
        "event"
    } else {
        "events"
    }
}

/// Queues the event of one input line (nothing for a blank line or a # comment).
async fn queue_line(
    em: &mut Emitter,
    line: std::io::Result<String>,
    source: &str,
    timestamp_ns: i64,
) -> anyhow::Result<()> {
    let line = line.map_err(|e| anyhow!("cannot read standard input: {e}"))?;
    let mut tokens = line.split_whitespace();
    let name = match tokens.next() {
        None => return Ok(()),
        Some(t) if t.starts_with('#') => return Ok(()),
        Some(name) => name,
    };
    let tokens: Vec<&str> = tokens.collect();
    let fields = resolve(em, name, &tokens).await?;
    em.queue(name, source, timestamp_ns, &fields)
        .await
        .map_err(emit_err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn emit_parses_field_tokens() {
        assert_eq!(
            parse_field("load=3.5").unwrap(),
            ("load".into(), Raw::Auto("3.5".into()))
        );
        assert_eq!(
            parse_field("id:s=123").unwrap(),
            ("id".into(), Raw::Text("123".into()))
        );
        assert_eq!(
            parse_field("x:n=-2e3").unwrap(),
            ("x".into(), Raw::Number(-2000.0))
        );
        assert_eq!(
            parse_field("msg=a=b").unwrap(),
            ("msg".into(), Raw::Auto("a=b".into()))
        );
        assert_eq!(
            parse_field("empty=").unwrap(),
            ("empty".into(), Raw::Auto(String::new()))
        );
        let e = parse_field("load").unwrap_err().to_string();
        assert!(e.contains("expected field=value"), "{e}");
        let e = parse_field("x:n=abc").unwrap_err().to_string();
        assert_eq!(e, "\"x:n=abc\": \"abc\" is not a number");
        let e = parse_field("x:q=1").unwrap_err().to_string();
        assert!(e.contains("unknown type :q"), "{e}");
        assert!(parse_field("=1")
            .unwrap_err()
            .to_string()
            .contains("no field name"));
        assert!(parse_field(":s=1")
            .unwrap_err()
            .to_string()
            .contains("no field name"));
    }

    #[test]
    fn emit_types_values_by_look_only_without_schema() {
        let f = vec![
            ("a".to_string(), Raw::Auto("3.5".into())),
            ("b".to_string(), Raw::Auto("abc".into())),
            ("c".to_string(), Raw::Auto("nan".into())),
            ("d".to_string(), Raw::Text("12".into())),
            ("e".to_string(), Raw::Number(1.0)),
            ("f".to_string(), Raw::Auto("-1e3".into())),
        ];
        let v: Vec<FieldValue> = field_values(f.clone(), false).into_iter().map(|x| x.1).collect();
        assert_eq!(
            v,
            vec![
                FieldValue::Number(3.5),
                FieldValue::Text("abc".into()),
                FieldValue::Text("nan".into()),
                FieldValue::Text("12".into()),
                FieldValue::Number(1.0),
                FieldValue::Number(-1000.0),
            ]
        );
        // Against a schema, untyped values go as text for the emitter to convert exactly.
        let v: Vec<FieldValue> = field_values(f, true).into_iter().map(|x| x.1).collect();
        assert_eq!(v[0], FieldValue::Text("3.5".into()));
        assert_eq!(v[4], FieldValue::Number(1.0));
    }

    #[test]
    fn emit_parses_times() {
        assert_eq!(parse_time("now").unwrap(), 0);
        assert_eq!(parse_time("@1").unwrap(), 1_000_000_000);
        assert_eq!(parse_time("@1700000000.25").unwrap(), 1_700_000_000_250_000_000);
        assert_eq!(parse_time("1234").unwrap(), 1234);
        assert_eq!(parse_time("1970-01-01T00:00:01Z").unwrap(), 1_000_000_000);
        assert_eq!(
            parse_time("2023-11-14T22:13:20Z").unwrap(),
            1_700_000_000_000_000_000
        );
        assert_eq!(
            parse_time("2023-11-15T00:13:20.5+02:00").unwrap(),
            1_700_000_000_500_000_000
        );
        assert_eq!(
            parse_time("2023-11-14t17:13:20.000000001-05:00").unwrap(),
            1_700_000_000_000_000_001
        );
        assert_eq!(
            parse_time("2024-02-29T00:00:00Z").unwrap(),
            1_709_164_800_000_000_000
        );
        for bad in [
            "",
            "yesterday",
            "@",
            "@-5",
            "@1.1234567891",
            "2023-02-29T00:00:00Z",
            "2023-11-14T24:00:00Z",
            "2023-11-14T22:13:20",
            "2023-11-14T22:13:20.Z",
            "2023-11-14T22:13:20+0200",
            "2023-11-14",
        ] {
            assert!(parse_time(bad).is_err(), "{bad:?} accepted");
        }
        assert!(parse_time("1969-12-31T23:59:59Z")
            .unwrap_err()
            .to_string()
            .contains("after 1970"));
        assert!(parse_time("2300-01-01T00:00:00Z")
            .unwrap_err()
            .to_string()
            .contains("out of range"));
    }
}
