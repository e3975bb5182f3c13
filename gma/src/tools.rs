//! Operator tools: search, subscribe, query, sim set.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use gma_consumer::directory;
use gma_consumer::stream::{ProducerStream, Progress, ResumePoint, StreamOptions};
use gma_consumer::subscriber::{Delivery, Subscriber, SubscriberOptions};
use gma_core::codec::EventRef;
use gma_core::event::push_json_str;
use gma_proto::v1 as pb;
use serde::{Deserialize, Serialize};

use clap::{Args, Subcommand};

use crate::args::{Output, PolicyArg};

fn status_line(what: &str, s: &tonic::Status) -> anyhow::Error {
    anyhow!("{what}: {} ({:?})", gma_core::tls::explain(s), s.code())
}

pub(crate) fn rpc_err(e: gma_consumer::ConsumerError) -> anyhow::Error {
    match &e {
        gma_consumer::ConsumerError::Rpc(what, s) => status_line(what, s),
        _ => anyhow!("{e}"),
    }
}

/// How long a command waits for a directory that answers "no leader known yet".
const ELECTION_WAIT: Duration = Duration::from_secs(15);

/// "waiting for …" lines on stderr while a command retries something UNAVAILABLE, when
/// stderr is a terminal (scripts read the exit status and the final message instead): one line
/// when a wait starts, none while it lasts.
struct Waiting {
    tty: bool,
    shown: std::collections::HashSet<String>,
}

impl Waiting {
    fn new() -> Waiting {
        use std::io::IsTerminal;
        Waiting {
            tty: std::io::stderr().is_terminal(),
            shown: Default::default(),
        }
    }

    /// Says once that the command waits for `what` (because of `why`).
    fn wait(&mut self, what: &str, why: &str) {
        if self.tty && self.shown.insert(what.to_string()) {
            eprintln!("waiting for {what}: {why}");
        }
    }

    /// `what` answers again: the next wait for it is said again.
    fn done(&mut self, what: &str) {
        self.shown.remove(what);
    }
}

/// Runs `call` again while the directory answers UNAVAILABLE (an election in progress: a
/// member that has just started, or a failover), for at most [`ELECTION_WAIT`]; any other
/// answer, or the last UNAVAILABLE, is returned as it is.
async fn while_electing<T, F, Fut>(mut call: F) -> Result<T, gma_consumer::ConsumerError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, gma_consumer::ConsumerError>>,
{
    let deadline = tokio::time::Instant::now() + ELECTION_WAIT;
    let mut backoff = Duration::from_millis(50);
    let mut waiting = Waiting::new();
    loop {
        match call().await {
            Err(e)
                if e.status().is_some_and(|s| s.code() == tonic::Code::Unavailable)
                    && tokio::time::Instant::now() + backoff < deadline =>
            {
                tracing::debug!(error = %e, "directory not ready; retrying");
                waiting.wait("the directory", &e.to_string());
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(1));
            }
            r => return r,
        }
    }
}

/// The producers of `pattern`, once the directory has a leader.
async fn producers_of(
    client: &pb::directory_client::DirectoryClient<tonic::transport::Channel>,
    pattern: &str,
) -> anyhow::Result<Vec<pb::ProducerRecord>> {
    while_electing(|| {
        let (mut c, pattern) = (client.clone(), pattern.to_string());
        async move { directory::producers(&mut c, &pattern, "").await }
    })
    .await
    .map_err(rpc_err)
}

pub async fn search(a: SearchArgs) -> anyhow::Result<()> {
    let client = directory::client(&a.directory).await.map_err(rpc_err)?;
    let kind = if a.consumers {
        pb::RecordKind::Consumer
    } else {
        pb::RecordKind::Producer
    };
    let req = pb::SearchRequest {
        kind: kind as i32,
        event_pattern: if a.pattern == "*" {
            String::new()
        } else {
            a.pattern.clone()
        },
        source: a.source.clone().unwrap_or_default(),
        stale_ok: a.stale_ok,
        ..Default::default()
    };
    let (entries, _) = while_electing(|| {
        let (mut c, req) = (client.clone(), req.clone());
        async move { directory::search_all(&mut c, req).await }
    })
    .await
    .map_err(rpc_err)?;
    let mut out = std::io::stdout().lock();
    match a.output {
        Output::Json => {
            let items: Vec<serde_json::Value> = entries.iter().filter_map(record_json).collect();
            writeln!(out, "{}", serde_json::to_string_pretty(&items)?)?;
        }
        Output::Table => {
            if entries.is_empty() {
                writeln!(
                    out,
                    "no {} matches {:?}",
                    if a.consumers { "consumer" } else { "producer" },
                    a.pattern
                )?;
                return Ok(());
            }
            writeln!(
                out,
                "{:<40} {:<24} {:>7} {:>7}  EVENTS",
                "ID", "ADDRESS", "SOURCES", "LEASE"
            )?;
            for e in &entries {
                match e.record.as_ref().and_then(|r| r.record.as_ref()) {
                    Some(pb::record::Record::Producer(p)) => writeln!(
                        out,
                        "{:<40} {:<24} {:>7} {:>7}  {}",
                        p.id,
                        p.address,
                        p.sources.len(),
                        e.lease_id,
                        p.events.join(",")
                    )?,
                    Some(pb::record::Record::Consumer(c)) => writeln!(
                        out,
                        "{:<40} {:<24} {:>7} {:>7}  {} ({})",
                        c.id,
                        c.address,
                        "-",
                        e.lease_id,
                        c.accepts.join(","),
                        c.manner
                    )?,
                    None => {}
                }
            }
        }
    }
    Ok(())
}

fn record_json(e: &pb::RecordEntry) -> Option<serde_json::Value> {
    Some(match e.record.as_ref()?.record.as_ref()? {
        pb::record::Record::Producer(p) => serde_json::json!({
            "kind": "producer", "id": p.id, "address": p.address, "events": p.events,
            "sources": p.sources, "services": p.services, "site": p.site, "org": p.org,
            "attributes": p.attributes, "lease_id": e.lease_id, "mod_revision": e.mod_revision,
        }),
        pb::record::Record::Consumer(c) => serde_json::json!({
            "kind": "consumer", "id": c.id, "address": c.address, "accepts": c.accepts,
            "manner": c.manner, "site": c.site, "org": c.org, "attributes": c.attributes,
            "lease_id": e.lease_id, "mod_revision": e.mod_revision,
        }),
    })
}

/// Prints one event as a table row.
/// Stream options carrying the producer-side subscription parameters.
pub fn filter_options(f: &FilterArgs) -> StreamOptions {
    StreamOptions {
        when: f.when.clone().unwrap_or_default(),
        delta_pct: f.delta_pct.unwrap_or(0.0),
        summaries: f.summaries.clone(),
        forecast: f.forecast,
        policy: match f.policy {
            None => pb::SlowPolicy::Unspecified,
            Some(PolicyArg::Latest) => pb::SlowPolicy::Latest,
            Some(PolicyArg::DropOldest) => pb::SlowPolicy::DropOldest,
            Some(PolicyArg::Block) => pb::SlowPolicy::Block,
        },
        queue_events: f.queue_events.unwrap_or(0),
        ..StreamOptions::default()
    }
}

fn table_row(e: &EventRef<'_>) -> String {
    let mut s = format!(
        "{:>8} {} {:<14} {:<20}",
        e.seq,
        fmt_time(e.timestamp_ns),
        e.series.name,
        e.series.source
    );
    let (mut ni, mut si) = (0, 0);
    for f in e.series.fields.iter() {
        if f.r#type() == pb::FieldType::String {
            s.push_str(&format!(
                " {}={}",
                f.name,
                e.strings.get(si).map(String::as_str).unwrap_or("")
            ));
            si += 1;
        } else {
            let v = e.numbers.get(ni).copied().unwrap_or(f64::NAN);
            ni += 1;
            s.push_str(&format!(" {}={}", f.name, fmt_num(v)));
        }
    }
    if e.mark != gma_core::codec::Mark::None {
        s.push_str(&format!(" [{}]", e.mark.as_str()));
    }
    s
}

fn fmt_num(v: f64) -> String {
    if v.is_nan() {
        "-".into()
    } else if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}

fn fmt_time(ns: i64) -> String {
    let secs = ns.div_euclid(1_000_000_000);
    let ms = ns.rem_euclid(1_000_000_000) / 1_000_000;
    let day = secs.rem_euclid(86_400);
    format!(
        "{:02}:{:02}:{:02}.{ms:03}Z",
        day / 3600,
        (day / 60) % 60,
        day % 60
    )
}

#[derive(Serialize, Deserialize, Default)]
struct StateFile {
    producers: HashMap<String, Point>,
}

#[derive(Serialize, Deserialize, Clone, Copy)]
struct Point {
    epoch: u64,
    next_seq: u64,
}

fn read_state(path: &Path) -> anyhow::Result<HashMap<String, ResumePoint>> {
    match std::fs::read_to_string(path) {
        Ok(text) => {
            let s: StateFile = serde_json::from_str(&text).with_context(|| {
                format!(
                    "state file {} is not valid (delete it to start fresh)",
                    path.display()
                )
            })?;
            Ok(s.producers
                .into_iter()
                .map(|(k, p)| {
                    (
                        k,
                        ResumePoint {
                            epoch: p.epoch,
                            next_seq: p.next_seq,
                        },
                    )
                })
                .collect())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(HashMap::new()),
        Err(e) => Err(e).with_context(|| format!("cannot read state file {}", path.display())),
    }
}

/// Writes the state atomically (temp file + rename), so a kill never leaves half a file.
fn write_state(path: &Path, points: &HashMap<String, ResumePoint>) -> anyhow::Result<()> {
    let s = StateFile {
        producers: points
            .iter()
            .map(|(k, r)| {
                (
                    k.clone(),
                    Point {
                        epoch: r.epoch,
                        next_seq: r.next_seq,
                    },
                )
            })
            .collect(),
    };
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, serde_json::to_vec(&s)?)
        .with_context(|| format!("cannot write {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("cannot write {}", path.display()))?;
    Ok(())
}

pub async fn subscribe(a: SubscribeArgs) -> anyhow::Result<()> {
    a.target.validate()?;
    let opts = StreamOptions {
        patterns: vec![a.target.pattern.clone()],
        sources: a.target.source.iter().cloned().collect(),
        consumer_id: format!("gma-subscribe-{}", std::process::id()),
        min_interval_ms: a.min_interval_ms.unwrap_or(0),
        ..filter_options(&a.filters)
    };
    let mut resume = match &a.state {
        Some(p) => read_state(p)?,
        None => HashMap::new(),
    };
    let limit = a.count.unwrap_or(u64::MAX);
    let mut printed = 0u64;
    let stdout = std::io::stdout();
    let print = |e: &EventRef<'_>, out: &mut std::io::StdoutLock<'_>| -> std::io::Result<()> {
        match a.output {
            Output::Json => writeln!(out, "{}", e.to_json()),
            Output::Table => writeln!(out, "{}", table_row(e)),
        }
    };
    if let Some(addr) = &a.target.producer {
        // Direct subscription: the state file key is the producer address.
        let start = resume.get(addr).copied();
        let mut stream = ProducerStream::new(
            addr,
            StreamOptions {
                reconnect: false,
                ..opts
            },
        )
        .with_resume(start);
        while printed < limit {
            let mut out = stdout.lock();
            let mut io_err = None;
            let progress = stream
                .next_with(|e| {
                    if printed < limit {
                        if let Err(err) = print(&e, &mut out) {
                            io_err = Some(err);
                        }
                        printed += 1;
                    }
                })
                .await
                .map_err(rpc_err)?;
            out.flush()?;
            if let Some(e) = io_err {
                return broken_pipe_ok(e);
            }
            if let (Some(p), Some(rp)) = (&a.state, stream.resume_point()) {
                resume.insert(addr.clone(), rp);
                write_state(p, &resume)?;
            }
            match progress {
                None => bail!("producer {addr} ended the subscription"),
                Some(Progress::Batch { gaps, .. }) => report_gaps(addr, &gaps),
                Some(_) => {}
            }
        }
        return Ok(());
    }
    let Some(dir) = a.target.directory.clone() else {
        bail!("give --directory ADDR or --producer ADDR");
    };
    // Fail fast on an unreachable directory, with a clear line; a directory that is still
    // electing its leader (just started, or failing over) is waited for, within a bound.
    let client = directory::client(&dir).await.map_err(rpc_err)?;
    let found = producers_of(&client, &a.target.pattern).await?;
    if found.is_empty() {
        eprintln!(
            "no producer offers {:?} yet; waiting for one to register",
            a.target.pattern
        );
    }
    let mut sub = Subscriber::start(
        SubscriberOptions {
            directory: dir,
            stream: opts,
            capacity: 64,
            default_resume: None,
        },
        resume.clone(),
    );
    let mut waiting = Waiting::new();
    while printed < limit {
        let Some(d) = sub.recv().await else {
            bail!("subscriber stopped");
        };
        match d {
            Delivery::Events { events, producer, .. } => {
                waiting.done(&producer);
                waiting.done("the directory");
                let mut out = stdout.lock();
                for e in &events {
                    if printed >= limit {
                        break;
                    }
                    if let Err(err) = print(&e.as_ref(), &mut out) {
                        return broken_pipe_ok(err);
                    }
                    printed += 1;
                }
                if let Err(err) = out.flush() {
                    return broken_pipe_ok(err);
                }
                if let Some(p) = &a.state {
                    write_state(p, &sub.resume_points())?;
                }
            }
            Delivery::Gap { producer, gap } => report_gaps(&producer, &[gap]),
            Delivery::Reconnecting { producer, error } => {
                tracing::info!(%producer, %error, "reconnecting");
                waiting.wait(&producer, &error);
            }
            // Refusals end the command at once: asking again would get the same answer.
            Delivery::Refused { producer, error } => {
                return Err(anyhow!("producer {producer} refused the subscription: {error}"))
            }
            Delivery::DirectoryRefused { error } => {
                return Err(anyhow!("the directory refused the subscription: {error}"))
            }
            Delivery::Gone { producer, reason } => {
                eprintln!("producer {producer} left the directory ({reason})")
            }
            Delivery::DirectoryDown { error } => {
                tracing::info!(%error, "directory unreachable; streams continue");
                waiting.wait("the directory", &error);
            }
            Delivery::Subscribed { producer, .. } => waiting.done(&producer),
            Delivery::Discovered { .. } => {}
        }
    }
    Ok(())
}

fn broken_pipe_ok(e: std::io::Error) -> anyhow::Result<()> {
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        Ok(())
    } else {
        Err(e.into())
    }
}

fn report_gaps(producer: &str, gaps: &[pb::Gap]) {
    for g in gaps {
        if g.to_seq == u64::MAX {
            eprintln!("gap from {producer}: {}", g.reason);
        } else {
            eprintln!(
                "gap from {producer}: seqs {}..={} ({} events lost): {}",
                g.from_seq, g.to_seq, g.dropped, g.reason
            );
        }
    }
}

pub async fn query(a: QueryArgs) -> anyhow::Result<()> {
    a.target.validate()?;
    let targets: Vec<(String, String)> = match (&a.target.producer, &a.target.directory) {
        (Some(p), _) => vec![(p.clone(), p.clone())],
        (None, Some(d)) => {
            let client = directory::client(d).await.map_err(rpc_err)?;
            let found = producers_of(&client, &a.target.pattern).await?;
            if found.is_empty() {
                bail!("no producer in the directory offers {:?}", a.target.pattern);
            }
            found.into_iter().map(|p| (p.id, p.address)).collect()
        }
        (None, None) => bail!("give --directory ADDR or --producer ADDR"),
    };
    let req = pb::QueryRequest {
        patterns: vec![a.target.pattern.clone()],
        sources: a.target.source.iter().cloned().collect(),
        max_age_ms: a.max_age_ms.unwrap_or(0),
        since_ms: a.since.unwrap_or(0),
        limit: a.limit.unwrap_or(0),
    };
    let mut events = Vec::new();
    let mut schemas: HashMap<String, pb::EventSchema> = HashMap::new();
    let mut errors = Vec::new();
    for (id, addr) in &targets {
        let ch = match gma_consumer::connect(addr).await {
            Ok(c) => c,
            Err(e) => {
                errors.push(format!("{id}: {e}"));
                continue;
            }
        };
        let mut client = pb::producer_client::ProducerClient::new(ch);
        match client.query(req.clone()).await {
            Ok(r) => {
                let r = r.into_inner();
                if r.omitted > 0 {
                    eprintln!(
                        "warning: {id}: {} older events of the window left out (raise --limit)",
                        r.omitted
                    );
                }
                if let Some(ms) = a.since {
                    let from = gma_core::time::now_ns().saturating_sub((ms as i64).saturating_mul(1_000_000));
                    if r.held_since_ns > from {
                        eprintln!(
                            "warning: {id}: its buffer holds events since {} only: the window's start is gone",
                            gma_core::time::format_rfc3339(r.held_since_ns)
                        );
                    }
                }
                events.extend(r.events);
                schemas.extend(r.schemas.into_iter().map(|s| (s.name.clone(), s)));
            }
            Err(s) if s.code() == tonic::Code::NotFound => {}
            Err(s) => errors.push(format!("{id}: {} ({:?})", s.message(), s.code())),
        }
    }
    for e in &errors {
        eprintln!("warning: {e}");
    }
    if events.is_empty() {
        if !errors.is_empty() && errors.len() == targets.len() {
            bail!("no producer answered: {}", errors.join("; "));
        }
        let age = match (a.since, a.max_age_ms) {
            (Some(ms), _) => format!(" in the last {ms} ms still held by the producer"),
            (None, Some(m)) => format!(" within {m} ms"),
            (None, None) => String::new(),
        };
        bail!("no event available for {:?}{age}", a.target.pattern);
    }
    let mut out = std::io::stdout().lock();
    for e in &events {
        let line = match a.output {
            Output::Json => wire_json(e, schemas.get(&e.name)),
            Output::Table => {
                let vals: Vec<String> = e
                    .values
                    .iter()
                    .map(|v| match &v.kind {
                        Some(pb::value::Kind::Number(n)) => fmt_num(*n),
                        Some(pb::value::Kind::Text(t)) => t.clone(),
                        None => "-".into(),
                    })
                    .collect();
                format!(
                    "{:>8} {} {:<14} {:<20} {}",
                    e.seq,
                    fmt_time(e.timestamp_ns),
                    e.name,
                    e.source,
                    vals.join(" ")
                )
            }
        };
        if let Err(err) = writeln!(out, "{line}") {
            return broken_pipe_ok(err);
        }
    }
    Ok(())
}

/// JSON for a self-describing event: values by field name when the schema is known, else an
/// array in schema order.
fn wire_json(e: &pb::Event, schema: Option<&pb::EventSchema>) -> String {
    if let Some(schema) = schema.filter(|s| s.fields.len() == e.values.len()) {
        if let Ok(d) = gma_core::event::from_wire(e, schema) {
            return d.to_json(e.seq, &schema.fields);
        }
    }
    let mut s = String::from("{\"name\":");
    push_json_str(&mut s, &e.name);
    s.push_str(",\"source\":");
    push_json_str(&mut s, &e.source);
    s.push_str(&format!(
        ",\"timestamp_ns\":{},\"seq\":{},\"values\":[",
        e.timestamp_ns, e.seq
    ));
    for (i, v) in e.values.iter().enumerate() {
        if i > 0 {
            s.push(',');
        }
        match &v.kind {
            Some(pb::value::Kind::Number(n)) if n.is_finite() => s.push_str(&format!("{n}")),
            Some(pb::value::Kind::Text(t)) => push_json_str(&mut s, t),
            _ => s.push_str("null"),
        }
    }
    s.push_str("]}");
    s
}

pub async fn sim(cmd: SimCommand) -> anyhow::Result<()> {
    let SimCommand::Set {
        host,
        values,
        producer,
    } = cmd;
    let mut map = HashMap::new();
    for kv in &values {
        let (k, v) = kv
            .split_once('=')
            .ok_or_else(|| anyhow!("expected key=value, got {kv:?}"))?;
        let v: f64 = v
            .trim()
            .parse()
            .map_err(|_| anyhow!("value of {k:?} is not a number: {v:?}"))?;
        map.insert(k.trim().to_string(), v);
    }
    let ch = gma_consumer::connect(&producer).await.map_err(rpc_err)?;
    let mut client = pb::simulator_client::SimulatorClient::new(ch);
    client
        .set(pb::SimSetRequest {
            host: host.clone(),
            values: map,
        })
        .await
        .map_err(|s| status_line("sim set", &s))?;
    println!("set {} on {host}", values.join(" "));
    Ok(())
}

#[derive(Args, Debug)]
pub struct SearchArgs {
    /// Event-name pattern, e.g. 'host.*' (default: all).
    #[arg(default_value = "*")]
    pub pattern: String,
    #[arg(long)]
    pub directory: String,
    /// Only producers serving this source (pattern).
    #[arg(long)]
    pub source: Option<String>,
    /// Search consumer records instead of producers.
    #[arg(long)]
    pub consumers: bool,
    /// Answer from the member asked, without confirming with the leader (may be slightly
    /// stale; scales reads across members).
    #[arg(long)]
    pub stale_ok: bool,
    #[arg(long, value_enum, default_value = "table")]
    pub output: Output,
}

/// What `subscribe` and `query` read: the producers of a pattern, found in the directory or
/// named, and optionally one source.
#[derive(Args, Debug)]
pub struct ReadTarget {
    /// Event-name pattern, e.g. host.cpu or 'host.*'.
    pub pattern: String,
    /// Directory address (discover producers); or use --producer.
    #[arg(long, required_unless_present = "producer")]
    pub directory: Option<String>,
    /// Ask this producer directly, bypassing the directory.
    #[arg(long)]
    pub producer: Option<String>,
    /// Only events from this source (pattern).
    #[arg(long)]
    pub source: Option<String>,
}

impl ReadTarget {
    /// The event pattern and the source pattern, checked.
    fn validate(&self) -> anyhow::Result<()> {
        gma_core::pattern::Pattern::event(&self.pattern).map_err(|e| anyhow!("{e}"))?;
        if let Some(s) = &self.source {
            gma_core::pattern::Pattern::source(s).map_err(|e| anyhow!("{e}"))?;
        }
        Ok(())
    }
}

#[derive(Args, Debug)]
pub struct SubscribeArgs {
    #[command(flatten)]
    pub target: ReadTarget,
    /// Exit after this many events.
    #[arg(long)]
    pub count: Option<u64>,
    /// At most one event per series per interval.
    #[arg(long)]
    pub min_interval_ms: Option<u64>,
    /// Resume state file: read at start, rewritten after every batch, so a restarted
    /// subscriber resumes where it stopped.
    #[arg(long)]
    pub state: Option<PathBuf>,
    #[command(flatten)]
    pub filters: FilterArgs,
    #[arg(long, value_enum, default_value = "table")]
    pub output: Output,
}

/// Subscription parameters evaluated by the producer.
#[derive(Args, Debug, Default, Clone)]
pub struct FilterArgs {
    /// Threshold crossing: only events where this expression changes value, marked enter or
    /// leave, e.g. 'host.cpu.user > 50' or 'load1 > 4 and free_cpus < 1'.
    #[arg(long)]
    pub when: Option<String>,
    /// Change filter: only events where a numeric field moved by more than this percent since
    /// the last event delivered for its series.
    #[arg(long)]
    pub delta_pct: Option<f64>,
    /// Rolling summaries instead of raw events (1m, 10m, 60m; repeatable): <name>.avg1m ...
    #[arg(long = "summary")]
    pub summaries: Vec<String>,
    /// Adaptive forecasts instead of raw events: <name>.forecast.
    #[arg(long)]
    pub forecast: bool,
    /// Slow-consumer policy (default: latest for *.load patterns, else drop-oldest).
    #[arg(long, value_enum)]
    pub policy: Option<PolicyArg>,
    /// How far behind (producer events) before the policy acts.
    #[arg(long)]
    pub queue_events: Option<u32>,
}

#[derive(Args, Debug)]
pub struct QueryArgs {
    #[command(flatten)]
    pub target: ReadTarget,
    /// Only events at most this old.
    #[arg(long)]
    pub max_age_ms: Option<u64>,
    /// Every event of this last window still held in the producer's resume buffer (e.g. 5m,
    /// 90s, 1h), not only the latest per series; authorized like a subscription.
    #[arg(long, value_parser = parse_since)]
    pub since: Option<u64>,
    /// With --since: at most this many events per producer, the most recent (default 10000).
    #[arg(long, requires = "since")]
    pub limit: Option<u32>,
    #[arg(long, value_enum, default_value = "table")]
    pub output: Output,
}

/// `--since`: a duration (`5m`, `90s`) in milliseconds, at least 1 ms.
fn parse_since(s: &str) -> anyhow::Result<u64> {
    let ns = gma_core::time::parse_duration(s)?;
    match u64::try_from(ns / 1_000_000) {
        Ok(ms) if ms >= 1 => Ok(ms),
        _ => bail!("{s:?}: give a window of at least 1ms, e.g. 5m"),
    }
}

#[derive(Subcommand, Debug)]
pub enum SimCommand {
    /// Set values of a simulated host: gma sim set hostA load=3.5 free_cpus=0 --producer ADDR
    Set {
        host: String,
        /// key=value pairs (load, free_cpus, queue_waiting, cpus, memory_mb, bench_<name>).
        #[arg(required = true)]
        values: Vec<String>,
        #[arg(long)]
        producer: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;
    use gma_consumer::ConsumerError;

    fn answer(code: tonic::Code) -> Result<u32, ConsumerError> {
        Err(ConsumerError::Rpc("search".into(), tonic::Status::new(code, "x")))
    }

    #[tokio::test]
    async fn an_election_is_waited_for_and_other_errors_are_not() {
        // UNAVAILABLE twice, then an answer: the answer.
        let mut calls = 0;
        let r = while_electing(|| {
            calls += 1;
            let n = calls;
            async move {
                if n < 3 {
                    answer(tonic::Code::Unavailable)
                } else {
                    Ok(n)
                }
            }
        })
        .await;
        assert_eq!(r.ok(), Some(3));
        // Any other error at once.
        let mut calls = 0;
        let r = while_electing(|| {
            calls += 1;
            async { answer(tonic::Code::InvalidArgument) }
        })
        .await;
        assert_eq!(calls, 1);
        assert_eq!(
            r.err().and_then(|e| e.status().map(|s| s.code())),
            Some(tonic::Code::InvalidArgument)
        );
    }
}
