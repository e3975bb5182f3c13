//! Metric names of the netprobe (one place; prefix `gma_netprobe_`, bounded labels) and the
//! counters behind `net.probe` and the Status RPC.

use std::sync::atomic::{AtomicU64, Ordering};

/// Measurements published; label `kind` = rtt | bw.
pub const PROBES: &str = "gma_netprobe_probes_total";
/// Probes that failed or were abandoned; label `kind` = rtt | bw.
pub const PROBE_FAILURES: &str = "gma_netprobe_probe_failures_total";
/// Transfers skipped for the byte cap; label `whose` = own | target.
pub const SKIPPED_BUDGET: &str = "gma_netprobe_skipped_budget_total";
/// Probe payload bytes; label `direction` = sent | received.
pub const PROBE_BYTES: &str = "gma_netprobe_probe_bytes_total";
/// Tokens this host regenerated.
pub const TOKENS_REGENERATED: &str = "gma_netprobe_tokens_regenerated_total";
/// Duplicate tokens this host dropped (passes refused, own tokens given up).
pub const TOKENS_DROPPED: &str = "gma_netprobe_tokens_dropped_total";
/// Notices and passes sent; label `kind` = notice | pass.
pub const CONTROL_MESSAGES: &str = "gma_netprobe_control_messages_total";

/// Totals since start (relaxed atomics: only the totals matter).
#[derive(Debug, Default)]
pub struct Counters {
    pub rtt_probes: AtomicU64,
    pub bw_probes: AtomicU64,
    pub failures: AtomicU64,
    pub skipped_budget: AtomicU64,
    pub bytes_sent: AtomicU64,
    pub bytes_received: AtomicU64,
    pub control_messages: AtomicU64,
}

fn add(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

impl Counters {
    pub fn get(c: &AtomicU64) -> u64 {
        c.load(Ordering::Relaxed)
    }

    pub fn probed(&self, bw: bool) {
        let kind = if bw { "bw" } else { "rtt" };
        add(if bw { &self.bw_probes } else { &self.rtt_probes }, 1);
        metrics::counter!(PROBES, "kind" => kind).increment(1);
    }

    pub fn failed(&self, bw: bool) {
        add(&self.failures, 1);
        metrics::counter!(PROBE_FAILURES, "kind" => if bw { "bw" } else { "rtt" }).increment(1);
    }

    pub fn skipped(&self, whose: &'static str) {
        add(&self.skipped_budget, 1);
        metrics::counter!(SKIPPED_BUDGET, "whose" => whose).increment(1);
    }

    pub fn sent(&self, n: u64) {
        add(&self.bytes_sent, n);
        metrics::counter!(PROBE_BYTES, "direction" => "sent").increment(n);
    }

    pub fn received(&self, n: u64) {
        add(&self.bytes_received, n);
        metrics::counter!(PROBE_BYTES, "direction" => "received").increment(n);
    }

    pub fn control(&self, kind: &'static str, n: u64) {
        add(&self.control_messages, n);
        metrics::counter!(CONTROL_MESSAGES, "kind" => kind).increment(n);
    }

    pub fn probes(&self) -> u64 {
        Counters::get(&self.rtt_probes) + Counters::get(&self.bw_probes)
    }
}
