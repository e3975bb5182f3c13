//! The events a netprobe publishes.
//!
//! - `net.rtt`, source `<src>/<dst>`: one latency probe from this host (src) to a peer (dst).
//! - `net.bw`, source `<src>/<dst>`: one throughput probe (payload goodput, src → dst).
//! - `net.rtt.forecast`, `net.bw.forecast`: the producer's adaptive forecasts of each link
//!   (`f`, `f_mae`, `f_method` per numeric field; docs/producer.md).
//! - `net.probe`, source `<src>`: what probing costs this host, every `report_ms`.
//!
//! A measurement's event timestamp is the probe's start; it ended `duration_ns` later (exact:
//! an integer below 2^53). `token` (`generation.seq`) and `origin` name the token under which it
//! ran, so a consumer can check from the events alone that no two probes of a clique overlapped
//! and that one token was circulating.

use gma_core::event::{dbl, schema, text, EventData};
use gma_proto::v1 as pb;

use crate::clique::Token;

pub const RTT: &str = "net.rtt";
pub const BW: &str = "net.bw";
pub const PROBE: &str = "net.probe";
pub const RTT_FORECAST: &str = "net.rtt.forecast";
pub const BW_FORECAST: &str = "net.bw.forecast";

fn link_fields(mut numbers: Vec<pb::FieldSpec>) -> Vec<pb::FieldSpec> {
    numbers.extend([
        dbl("duration_ns", "ns", "probe end minus start (the event timestamp)"),
        text("src", "probing host"),
        text("dst", "probed host"),
        text("token", "clique token the probe ran under: generation.seq"),
        text("origin", "member that generated that token"),
    ]);
    numbers
}

pub fn schemas() -> Vec<pb::EventSchema> {
    vec![
        schema(
            RTT,
            "network latency from src to dst (NWS-style coordinated probe)",
            link_fields(vec![dbl(
                "rtt_ms",
                "ms",
                "round-trip time of a small echo (minimum of the probe's echoes)",
            )]),
        ),
        schema(
            BW,
            "network bandwidth from src to dst (NWS-style coordinated probe)",
            link_fields(vec![
                dbl(
                    "mbps",
                    "Mbit/s",
                    "payload throughput of a timed transfer src -> dst",
                ),
                dbl("bytes", "bytes", "payload bytes transferred"),
            ]),
        ),
        schema(
            PROBE,
            "cost of network probing on this host (intrusiveness)",
            vec![
                dbl(
                    "probes",
                    "probes",
                    "measurements published (net.rtt + net.bw) since start",
                ),
                dbl("rtt_probes", "probes", "latency measurements since start"),
                dbl("bw_probes", "probes", "throughput measurements since start"),
                dbl("failures", "probes", "probes that failed or were abandoned"),
                dbl(
                    "skipped_budget",
                    "transfers",
                    "transfers skipped for the bytes-per-second cap (ours or the target's)",
                ),
                dbl("bytes_sent", "bytes", "probe payload bytes sent, both roles"),
                dbl(
                    "bytes_received",
                    "bytes",
                    "probe payload bytes received, both roles",
                ),
                dbl(
                    "bytes_per_s",
                    "bytes/s",
                    "probe payload bytes (sent + received) per second since the last report",
                ),
                dbl(
                    "control_messages",
                    "messages",
                    "notices and passes sent since start",
                ),
                dbl(
                    "cpu_pct",
                    "%",
                    "CPU of this netprobe process since the last report (% of one core)",
                ),
                dbl("members", "hosts", "clique members seen (this host included)"),
                dbl("holding", "", "1 while this host holds the token"),
                dbl("generation", "", "generation of the newest token seen"),
                dbl(
                    "regenerations",
                    "tokens",
                    "tokens this host regenerated since start",
                ),
                dbl(
                    "tokens_dropped",
                    "tokens",
                    "duplicate tokens this host dropped since start",
                ),
                text("site", "the clique"),
                text("holder", "holder of the newest token seen"),
            ],
        ),
    ]
}

/// One measurement of a link.
#[derive(Debug, Clone, PartialEq)]
pub struct Measurement {
    pub src: String,
    pub dst: String,
    pub start_ns: i64,
    pub duration_ns: u64,
    pub kind: Kind,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Kind {
    Rtt { rtt_ms: f64 },
    Bw { mbps: f64, bytes: u64 },
}

/// The `<src>/<dst>` source of a link's series.
pub fn link(src: &str, dst: &str) -> String {
    format!("{src}/{dst}")
}

/// `(src, dst)` of a link source; `None` unless it has exactly one `/`.
pub fn split_link(source: &str) -> Option<(&str, &str)> {
    let (s, d) = source.split_once('/')?;
    (!s.is_empty() && !d.is_empty() && !d.contains('/')).then_some((s, d))
}

impl Measurement {
    pub fn event(&self, token: &Token) -> EventData {
        let (name, mut numbers) = match self.kind {
            Kind::Rtt { rtt_ms } => (RTT, vec![rtt_ms]),
            Kind::Bw { mbps, bytes } => (BW, vec![mbps, bytes as f64]),
        };
        numbers.push(self.duration_ns as f64);
        EventData {
            name: name.into(),
            source: link(&self.src, &self.dst),
            timestamp_ns: self.start_ns,
            numbers,
            strings: vec![
                self.src.clone(),
                self.dst.clone(),
                token.label(),
                token.origin.clone(),
            ],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_conform_to_their_schemas() {
        for s in schemas() {
            gma_core::event::validate_schema(&s).unwrap();
        }
        let t = Token {
            generation: 2,
            origin: "a@x".into(),
            seq: 9,
            holder: "a@x".into(),
        };
        let m = Measurement {
            src: "a".into(),
            dst: "b".into(),
            start_ns: 5,
            duration_ns: 7,
            kind: Kind::Bw {
                mbps: 19.5,
                bytes: 1024,
            },
        };
        let e = m.event(&t);
        assert_eq!(e.source, "a/b");
        assert_eq!(e.numbers, [19.5, 1024.0, 7.0]);
        assert_eq!(e.strings, ["a", "b", "2.9", "a@x"]);
        let hub = gma_producer::Hub::new(1, 100);
        hub.add_schemas(&schemas()).unwrap();
        hub.publish(&[e]).1.unwrap();
        assert_eq!(split_link("a/b"), Some(("a", "b")));
        assert_eq!(split_link("a/b/c"), None);
        assert_eq!(split_link("a"), None);
    }

    /// The wire contract: field names, types and units, in order.
    #[test]
    fn schemas_are_pinned() {
        assert_eq!(
            gma_core::event::signature(&schemas()[0]),
            "net.rtt v1: rtt_ms double ms, duration_ns double ns, src string, dst string, token string, origin string"
        );
        assert_eq!(
            gma_core::event::signature(&schemas()[1]),
            "net.bw v1: mbps double Mbit/s, bytes double bytes, duration_ns double ns, src string, dst string, token string, origin string"
        );
        assert_eq!(
            gma_core::event::signature(&schemas()[2]),
            "net.probe v1: probes double probes, rtt_probes double probes, bw_probes double probes, failures double probes, skipped_budget double transfers, bytes_sent double bytes, bytes_received double bytes, bytes_per_s double bytes/s, control_messages double messages, cpu_pct double %, members double hosts, holding double, generation double, regenerations double tokens, tokens_dropped double tokens, site string, holder string"
        );
    }
}
