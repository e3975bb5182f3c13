//! `gma sink`: a consumer that accepts pushed streams and prints them.
//!
//! It registers a consumer record (accepted patterns, manner) in the directory; producers that
//! offer matching events push to it over `Consumer.Deliver`. Events print as JSON lines on
//! stdout; stream openings and endings print on stderr. `--end-after N` ends each producer's
//! stream after N events (the consumer ending a producer-initiated stream).
//!
//! `--tls-cert`/`--tls-key` serve the endpoint over TLS; with `--tls-client-ca` only producers
//! holding a certificate of that CA may push, and with `--access-policy` only identities allowed
//! `ingest` on what they push. Plaintext is refused off loopback.

use std::io::Write;
use std::sync::Arc;

use anyhow::{anyhow, bail};
use clap::Args;
use gma_consumer::sink::{HandlerError, Sink, SinkConfig, SinkHandler};
use gma_core::codec::OwnedEvent;
use gma_proto::v1 as pb;
use std::sync::Mutex as StdMutex;

use crate::args::{require_directory, PolicyArg, RoleArgs};
use crate::runtime::open_endpoint;
use crate::serve::shutdown_signal;

#[derive(Args, Debug)]
#[command(mut_arg("listen", |a| a.help("Listen address for pushed streams (default 127.0.0.1:0, any free port)")))]
#[command(mut_arg("directory", |a| a.help("Directory address(es), ADDR[,ADDR...], to register in (required)")))]
// The sink has no config file (its flags are its settings): the shared --config is hidden and
// refused.
#[command(mut_arg("config", |a| a.hide(true)))]
pub struct SinkArgs {
    /// Event-name patterns accepted (repeatable).
    #[arg(long = "accept", required = true)]
    pub accepts: Vec<String>,
    /// Source patterns accepted (repeatable; default any).
    #[arg(long = "source")]
    pub sources: Vec<String>,
    /// How the events are consumed, as registered (e.g. archive).
    #[arg(long, default_value = "print")]
    pub manner: String,
    /// Record id (default sink@<address>).
    #[arg(long)]
    pub id: Option<String>,
    /// Slow-consumer policy asked of producers.
    #[arg(long, value_enum, default_value = "drop-oldest")]
    pub policy: PolicyArg,
    /// End each producer's stream after this many events from it.
    #[arg(long)]
    pub end_after: Option<u64>,
    #[command(flatten)]
    pub role: RoleArgs,
}

struct Printer {
    end_after: Option<u64>,
    counts: StdMutex<std::collections::HashMap<String, u64>>,
    sink: StdMutex<Option<Arc<Sink>>>,
}

impl SinkHandler for Printer {
    fn opened(&self, hello: &pb::DeliverHello) {
        eprintln!(
            "stream from {} ({}) opened: {}",
            hello.producer_id,
            hello.address,
            hello.events.join(",")
        );
    }

    fn events(
        &self,
        producer_id: &str,
        events: Vec<OwnedEvent>,
        gaps: &[pb::Gap],
    ) -> Result<(), HandlerError> {
        for g in gaps {
            eprintln!(
                "gap from {producer_id}: seqs {}..={} ({} events): {}",
                g.from_seq, g.to_seq, g.dropped, g.reason
            );
        }
        let mut out = std::io::stdout().lock();
        let n = events.len() as u64;
        for e in &events {
            writeln!(out, "{}", e.as_ref().to_json()).map_err(|e| format!("stdout: {e}"))?;
        }
        out.flush().map_err(|e| format!("stdout: {e}"))?;
        if let Some(limit) = self.end_after {
            let mut counts = self
                .counts
                .lock()
                .map_err(|_| "the event counts are poisoned (a thread panicked)")?;
            let c = counts.entry(producer_id.to_string()).or_default();
            *c += n;
            if *c >= limit {
                if let Some(sink) = self.sink.lock().ok().and_then(|s| s.clone()) {
                    sink.end(producer_id, &format!("received {limit} events"));
                }
            }
        }
        Ok(())
    }

    fn closed(&self, producer_id: &str, reason: &str) {
        eprintln!("stream from {producer_id} closed: {reason}");
    }
}

pub async fn run(a: SinkArgs) -> anyhow::Result<()> {
    for p in &a.accepts {
        gma_core::pattern::Pattern::event(p).map_err(|e| anyhow!("--accept {p}: {e}"))?;
    }
    for p in &a.sources {
        gma_core::pattern::Pattern::source(p).map_err(|e| anyhow!("--source {p}: {e}"))?;
    }
    // The sink has no config file: the flags are its settings. TLS from the flags
    // (--tls-cert/--tls-key/--tls-client-ca serve the Consumer endpoint; --tls-ca is for the
    // directory); --access-policy decides who may push (ingest).
    a.role.endpoint.refuse_rpc_events("the sink")?;
    if a.role.config.is_some() {
        bail!("the sink has no config file: give its settings as flags (gma sink --help)");
    }
    let mut config = SinkConfig {
        accepts: a.accepts.clone(),
        sources: a.sources.clone(),
        manner: a.manner.clone(),
        policy: match a.policy {
            PolicyArg::Latest => pb::SlowPolicy::Latest,
            PolicyArg::DropOldest => pb::SlowPolicy::DropOldest,
            PolicyArg::Block => pb::SlowPolicy::Block,
        },
        ..SinkConfig::default()
    };
    let mut listen = "127.0.0.1:0".to_string();
    a.role
        .apply(&mut listen, &mut config.registration, &mut config.endpoint)?;
    require_directory(&config.registration.directory)?;
    // A bad policy file is a startup error, before the address is bound.
    gma_core::guard::load_policy(config.endpoint.access_policy.as_ref())
        .map_err(|e| anyhow!("--access-policy: {e}"))?;
    let listener = open_endpoint("sink", &listen, &config.endpoint).await?;
    config.registration.id = a.id.clone();
    let printer = Arc::new(Printer {
        end_after: a.end_after,
        counts: StdMutex::new(Default::default()),
        sink: StdMutex::new(None),
    });
    let sink = Sink::new(config, printer.clone());
    if let Ok(mut s) = printer.sink.lock() {
        *s = Some(sink.clone());
    }
    sink.serve(listener, shutdown_signal())
        .await
        .map_err(|e| anyhow!("sink failed: {e}"))
}
