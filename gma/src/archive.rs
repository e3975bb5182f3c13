//! `gma archiver` (the role) and `gma archive query|series|export|stats` (its client).

use std::io::{IsTerminal, Write};
use std::path::PathBuf;

use anyhow::{anyhow, bail, Context};
use clap::builder::{PossibleValuesParser, TypedValueParser};
use clap::{Args, Subcommand, ValueEnum};
use gma_archiver::ArchiverConfig;
use gma_proto::v1::{self as pb, archive_client::ArchiveClient};
use tonic::transport::Channel;

use crate::args::{Output, RoleArgs};
use crate::runtime::{open_endpoint, with_companion};

#[derive(Args, Debug)]
#[command(mut_arg("listen", |a| a.help("Listen address of the Archive service (overrides `listen` in --config; default 127.0.0.1:7300)")))]
#[command(mut_arg("directory", |a| a.help("Directory address(es), ADDR[,ADDR...]: producers are discovered there (overrides `directory` in --config)")))]
pub struct ArchiverArgs {
    /// Data directory (or `data_dir` in --config).
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Event-name patterns to archive (repeatable; default all, or `patterns` in --config).
    #[arg(long = "pattern")]
    pub patterns: Vec<String>,
    /// Serve the Prometheus HTTP query API (PromQL over the archive, docs/promql.md) on ADDR
    /// (or `http_listen` in --config); behind the archiver's TLS and policy.
    #[arg(long)]
    pub http_listen: Option<String>,
    #[command(flatten)]
    pub role: RoleArgs,
}

/// `gma archiver`.
pub async fn archiver(a: ArchiverArgs) -> anyhow::Result<()> {
    let mut cfg: ArchiverConfig = a.role.load()?;
    a.role
        .apply(&mut cfg.listen, &mut cfg.registration, &mut cfg.endpoint)?;
    if let Some(d) = a.data {
        cfg.data_dir = d;
    }
    if !a.patterns.is_empty() {
        cfg.patterns = a.patterns;
    }
    if let Some(h) = a.http_listen {
        cfg.http_listen = Some(h);
    }
    cfg.validate().map_err(|e| anyhow!("{e}"))?;
    let listener = open_endpoint("archiver", &cfg.listen, &cfg.endpoint).await?;
    let bound = listener.local_addr()?;
    // gma.rpc through a companion producer (the archiver has no hub of its own).
    let rpc = gma_core::rpc::RpcStats::new("archiver");
    let shutdown = with_companion(
        "archiver",
        rpc.clone(),
        cfg.registration.directory.clone(),
        bound,
        &cfg.endpoint,
    )
    .await?;
    gma_archiver::run_with_rpc(cfg, listener, shutdown, rpc)
        .await
        .map_err(|e| anyhow!("archiver failed: {e}"))
}

#[derive(Args, Debug)]
pub struct ArchiveArgs {
    /// The archiver's address; or find one with --directory.
    #[arg(long, global = true)]
    pub archiver: Option<String>,
    /// Directory address(es): finds the archiver by its record.
    #[arg(long, global = true)]
    pub directory: Option<String>,
    #[command(subcommand)]
    pub command: ArchiveCommand,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum QueryOutput {
    Table,
    Json,
    Csv,
}

/// The aggregates `--agg` names (gma.proto's `Aggregate` without the prefix; raw is the default).
const AGGREGATES: [&str; 8] = ["mean", "min", "max", "sum", "count", "p50", "p90", "p99"];

fn aggregate(name: String) -> anyhow::Result<pb::Aggregate> {
    pb::Aggregate::from_str_name(&format!("AGGREGATE_{}", name.to_ascii_uppercase()))
        .ok_or_else(|| anyhow!("{name} is not an aggregate"))
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum ExportFormat {
    Csv,
    Jsonl,
    /// One row per sample: time, name, source, field, value, text (docs/parquet.md).
    Parquet,
}

/// Where an export's samples go.
enum ExportSink {
    Text(std::io::BufWriter<std::fs::File>, QueryOutput),
    Parquet(Box<crate::parquet::ParquetSink<std::io::BufWriter<std::fs::File>>>),
}

impl ExportSink {
    fn new(file: std::fs::File, format: ExportFormat) -> anyhow::Result<Self> {
        let mut w = std::io::BufWriter::new(file);
        Ok(match format {
            ExportFormat::Csv => {
                writeln!(w, "{CSV_HEADER}")?;
                ExportSink::Text(w, QueryOutput::Csv)
            }
            ExportFormat::Jsonl => ExportSink::Text(w, QueryOutput::Json),
            ExportFormat::Parquet => ExportSink::Parquet(Box::new(
                crate::parquet::ParquetSink::new(w).context("cannot start the parquet file")?,
            )),
        })
    }

    fn push(&mut self, p: &pb::SeriesPoints) -> anyhow::Result<u64> {
        Ok(match self {
            ExportSink::Text(w, fmt) => write_points(w, p, *fmt)?,
            ExportSink::Parquet(s) => s.push(p).context("cannot write the parquet file")?,
        })
    }

    fn finish(self) -> anyhow::Result<()> {
        let mut w = match self {
            ExportSink::Text(w, _) => w,
            ExportSink::Parquet(s) => s.finish().context("cannot write the parquet file")?,
        };
        w.flush()?;
        w.into_inner().map_err(|e| e.into_error())?.sync_all()?;
        Ok(())
    }
}

#[derive(Subcommand, Debug)]
pub enum ArchiveCommand {
    /// Samples (or aggregates per step) of the series matching PATTERN in a time range.
    Query {
        /// Event-name pattern, e.g. host.load or 'host.*'.
        pattern: String,
        /// Source pattern.
        #[arg(long)]
        source: Option<String>,
        /// One field (default: every field).
        #[arg(long)]
        field: Option<String>,
        /// Start: RFC 3339, `now`, or relative (`-15m`).
        #[arg(long, allow_hyphen_values = true, default_value = "-15m")]
        from: String,
        /// End (exclusive).
        #[arg(long, allow_hyphen_values = true, default_value = "now")]
        to: String,
        /// Bucket width (`1m`, `10s`); needs --agg.
        #[arg(long)]
        step: Option<String>,
        /// Aggregate per bucket (over the whole range without --step).
        #[arg(long, value_parser = PossibleValuesParser::new(AGGREGATES).try_map(aggregate))]
        agg: Option<pb::Aggregate>,
        #[arg(long, value_enum, default_value = "table")]
        output: QueryOutput,
    },
    /// The series stored, with sample counts and time spans.
    Series {
        /// Event-name pattern (default all).
        #[arg(default_value = "*")]
        pattern: String,
        #[arg(long)]
        source: Option<String>,
        #[arg(long, value_enum, default_value = "table")]
        output: Output,
    },
    /// Writes the raw samples of PATTERN in a range to a file.
    Export {
        pattern: String,
        #[arg(long)]
        source: Option<String>,
        #[arg(long, allow_hyphen_values = true)]
        from: String,
        #[arg(long, allow_hyphen_values = true, default_value = "now")]
        to: String,
        #[arg(long, value_enum, default_value = "csv")]
        format: ExportFormat,
        #[arg(long)]
        out: PathBuf,
    },
    /// Samples, bytes on disk, bytes/sample, ingest rate.
    Stats {
        #[arg(long, value_enum, default_value = "table")]
        output: Output,
    },
}

fn status_err(what: &str, s: tonic::Status) -> anyhow::Error {
    anyhow!("{what}: {} ({:?})", gma_core::tls::explain(&s), s.code())
}

/// The archiver's address: --archiver, or the first archiver record in the directory.
async fn locate(a: &ArchiveArgs) -> anyhow::Result<String> {
    if let Some(addr) = &a.archiver {
        return Ok(addr.clone());
    }
    let Some(dir) = &a.directory else {
        bail!("give --archiver ADDR or --directory ADDR (to find one)");
    };
    let mut client = gma_consumer::directory::client(dir)
        .await
        .map_err(|e| anyhow!("{e}"))?;
    let req = pb::SearchRequest {
        kind: pb::RecordKind::Consumer as i32,
        ..Default::default()
    };
    let (entries, _) = gma_consumer::directory::search_all(&mut client, req)
        .await
        .map_err(|e| anyhow!("{e}"))?;
    entries
        .iter()
        .filter_map(|e| match e.record.as_ref()?.record.as_ref()? {
            pb::record::Record::Consumer(c) if c.manner == gma_archiver::MANNER => {
                c.attributes.get(gma_archiver::ARCHIVE_ADDRESS_ATTR).cloned()
            }
            _ => None,
        })
        .next()
        .ok_or_else(|| anyhow!("no archiver is registered in the directory at {dir}"))
}

async fn client(a: &ArchiveArgs) -> anyhow::Result<ArchiveClient<Channel>> {
    let addr = locate(a).await?;
    let ch = gma_consumer::connect(&addr).await.map_err(|e| anyhow!("{e}"))?;
    Ok(ArchiveClient::new(ch).max_decoding_message_size(gma_core::MAX_MESSAGE_BYTES))
}

fn range(from: &str, to: &str) -> anyhow::Result<(i64, i64)> {
    let now = gma_core::time::now_ns();
    let f = gma_core::time::parse_instant(from, now).map_err(|e| anyhow!("--from: {e}"))?;
    let t = gma_core::time::parse_instant(to, now).map_err(|e| anyhow!("--to: {e}"))?;
    if t <= f {
        bail!("--to ({to}) must be after --from ({from})");
    }
    Ok((f, t))
}

fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

fn number_json(v: f64) -> serde_json::Value {
    serde_json::Number::from_f64(v).map_or(serde_json::Value::Null, serde_json::Value::Number)
}

/// Writes the points of one response piece.
fn write_points(out: &mut impl Write, p: &pb::SeriesPoints, format: QueryOutput) -> std::io::Result<u64> {
    let n = p.timestamps_ns.len();
    for i in 0..n {
        let ts = p.timestamps_ns[i];
        let text = p.texts.get(i);
        let value = p.values.get(i).copied();
        match format {
            QueryOutput::Table => {
                let v = match (value, text) {
                    (Some(v), _) => format!("{v}"),
                    (None, Some(t)) => t.clone(),
                    _ => String::new(),
                };
                writeln!(
                    out,
                    "{}  {:<16} {:<16} {:<14} {v}",
                    gma_core::time::format_rfc3339(ts),
                    p.name,
                    p.source,
                    p.field
                )?;
            }
            QueryOutput::Json => {
                let mut o = serde_json::json!({
                    "name": p.name, "source": p.source, "field": p.field,
                    "time": gma_core::time::format_rfc3339(ts), "timestamp_ns": ts,
                });
                match (value, text) {
                    (Some(v), _) => o["value"] = number_json(v),
                    (None, Some(t)) => o["value"] = serde_json::Value::String(t.clone()),
                    _ => {}
                }
                writeln!(out, "{o}")?;
            }
            QueryOutput::Csv => {
                let v = match (value, text) {
                    (Some(v), _) if v.is_nan() => String::new(),
                    (Some(v), _) => format!("{v}"),
                    (None, Some(t)) => csv_field(t),
                    _ => String::new(),
                };
                writeln!(
                    out,
                    "{},{},{},{},{}",
                    csv_field(&p.name),
                    csv_field(&p.source),
                    csv_field(&p.field),
                    ts,
                    v
                )?;
            }
        }
    }
    Ok(n as u64)
}

const CSV_HEADER: &str = "name,source,field,timestamp_ns,value";

pub async fn run(a: ArchiveArgs) -> anyhow::Result<()> {
    let mut c = client(&a).await?;
    match a.command {
        ArchiveCommand::Query {
            pattern,
            source,
            field,
            from,
            to,
            step,
            agg,
            output,
        } => {
            let (from_ns, to_ns) = range(&from, &to)?;
            let step_ns = match &step {
                Some(s) => {
                    if agg.is_none() {
                        bail!("--step needs --agg ({})", AGGREGATES.join(", "));
                    }
                    let step = gma_core::time::parse_duration(s).map_err(|e| anyhow!("--step: {e}"))?;
                    if step <= 0 {
                        bail!("--step must be positive, not {s}");
                    }
                    step
                }
                None => 0,
            };
            let req = pb::ArchiveQueryRequest {
                pattern,
                source: source.unwrap_or_default(),
                field: field.unwrap_or_default(),
                from_ns,
                to_ns,
                step_ns,
                aggregate: agg.unwrap_or(pb::Aggregate::Raw) as i32,
                max_points: 0,
            };
            let mut stream = c
                .query(req)
                .await
                .map_err(|s| status_err("query", s))?
                .into_inner();
            let stdout = std::io::stdout();
            let mut out = std::io::BufWriter::new(stdout.lock());
            if output == QueryOutput::Csv {
                writeln!(out, "{CSV_HEADER}")?;
            }
            let mut total = 0u64;
            while let Some(r) = stream.message().await.map_err(|s| status_err("query", s))? {
                for p in &r.series {
                    total += write_points(&mut out, p, output)?;
                }
            }
            out.flush()?;
            if total == 0 && output == QueryOutput::Table {
                eprintln!("no samples in the range");
            }
        }
        ArchiveCommand::Series {
            pattern,
            source,
            output,
        } => {
            let r = c
                .series(pb::ArchiveSeriesRequest {
                    pattern: if pattern == "*" { String::new() } else { pattern },
                    source: source.unwrap_or_default(),
                })
                .await
                .map_err(|s| status_err("series", s))?
                .into_inner();
            for s in &r.series {
                match output {
                    Output::Json => println!(
                        "{}",
                        serde_json::json!({
                            "name": s.name, "source": s.source, "field": s.field, "unit": s.unit,
                            "samples": s.samples, "first_ns": s.first_ns, "last_ns": s.last_ns,
                        })
                    ),
                    Output::Table => println!(
                        "{:<20} {:<16} {:<14} {:>10}  {} .. {}",
                        s.name,
                        s.source,
                        s.field,
                        s.samples,
                        gma_core::time::format_rfc3339(s.first_ns),
                        gma_core::time::format_rfc3339(s.last_ns)
                    ),
                }
            }
            if r.series.is_empty() && output == Output::Table {
                eprintln!("no series stored");
            }
        }
        ArchiveCommand::Export {
            pattern,
            source,
            from,
            to,
            format,
            out,
        } => {
            let (from_ns, to_ns) = range(&from, &to)?;
            let source = source.unwrap_or_default();
            // The series count sizes the progress bar.
            let series = c
                .series(pb::ArchiveSeriesRequest {
                    pattern: pattern.clone(),
                    source: source.clone(),
                })
                .await
                .map_err(|s| status_err("series", s))?
                .into_inner()
                .series
                .len() as u64;
            let file =
                std::fs::File::create(&out).with_context(|| format!("cannot create {}", out.display()))?;
            let mut sink = ExportSink::new(file, format)?;
            let bar = if std::io::stderr().is_terminal() {
                let b = indicatif::ProgressBar::new(series);
                b.set_style(
                    indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} series  {msg}  {elapsed}")
                        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
                );
                b
            } else {
                indicatif::ProgressBar::hidden()
            };
            let mut stream = c
                .query(pb::ArchiveQueryRequest {
                    pattern,
                    source,
                    field: String::new(),
                    from_ns,
                    to_ns,
                    step_ns: 0,
                    aggregate: pb::Aggregate::Raw as i32,
                    max_points: 0,
                })
                .await
                .map_err(|s| status_err("export", s))?
                .into_inner();
            let (mut samples, mut last_key) = (0u64, None::<(String, String, String)>);
            let mut done = 0u64;
            while let Some(r) = stream.message().await.map_err(|s| status_err("export", s))? {
                for p in &r.series {
                    let key = (p.name.clone(), p.source.clone(), p.field.clone());
                    if last_key.as_ref() != Some(&key) {
                        if last_key.is_some() {
                            done += 1;
                            bar.set_position(done.min(series));
                        }
                        last_key = Some(key);
                    }
                    samples += sink.push(p)?;
                    bar.set_message(format!("{samples} samples"));
                }
            }
            sink.finish()?;
            bar.finish_and_clear();
            // The peak RSS of this process (docs/parquet.md states the bound it stays under).
            let peak = gma_bench::report::peak_rss_mib(&std::process::id().to_string())
                .map_or_else(|| "unknown".to_string(), |m| format!("{m:.0} MiB"));
            eprintln!(
                "wrote {samples} samples of {series} series to {} (peak RSS {peak})",
                out.display()
            );
        }
        ArchiveCommand::Stats { output } => {
            let s = c
                .stats(pb::ArchiveStatsRequest {})
                .await
                .map_err(|s| status_err("stats", s))?
                .into_inner();
            match output {
                Output::Json => println!(
                    "{}",
                    serde_json::json!({
                        "streams": s.streams, "series": s.series, "samples": s.samples,
                        "bytes_on_disk": s.bytes_on_disk, "bytes_per_sample": s.bytes_per_sample,
                        "ingest_samples_per_s": s.ingest_samples_per_s, "producers": s.producers,
                        "wal_bytes": s.wal_bytes, "kept_abnormal": s.kept_abnormal,
                        "sampled_out": s.sampled_out, "retention_deleted": s.retention_deleted,
                    })
                ),
                Output::Table => {
                    println!("series              {} ({} streams)", s.series, s.streams);
                    println!("samples             {}", s.samples);
                    println!("bytes on disk       {}", s.bytes_on_disk);
                    println!("bytes/sample        {:.2}", s.bytes_per_sample);
                    println!(
                        "ingest              {:.0} samples/s (last 10 s)",
                        s.ingest_samples_per_s
                    );
                    println!("producers followed  {}", s.producers);
                    println!("write-ahead log     {} bytes", s.wal_bytes);
                    println!(
                        "keep-policy         {} abnormal kept, {} normal sampled out",
                        s.kept_abnormal, s.sampled_out
                    );
                    println!("retention           {} samples deleted", s.retention_deleted);
                }
            }
        }
    }
    Ok(())
}
