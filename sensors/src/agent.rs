//! `gma.agent`: what the monitoring agent itself costs — CPU, memory, threads, and how many
//! values and events it samples per second (counted by the producer in [`AgentCounters`]).
//!
//! CPU time comes from utime + stime of `/proc/self/stat`, in clock ticks. The tick rate is
//! read from the `AT_CLKTCK` entry of `/proc/self/auxv` (what `sysconf(_SC_CLK_TCK)` returns,
//! without needing libc); if that cannot be read we assume 100 Hz, the USER_HZ of every
//! mainstream Linux architecture. Resident memory is the `rss` field of the same
//! `/proc/self/stat` (the figure `VmRSS` of `/proc/self/status` shows, in pages) times the page
//! size (`AT_PAGESZ` of the auxiliary vector, else 4096): one `/proc` file a sample, not two —
//! the kernel's generation of `status` cost as much as `stat` (docs/PERFORMANCE.md, the
//! agent's CPU).

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::procfs::{elapsed_s, kib_to_mib, parse_num, rate, Emit, Files, Probe, ProcSensor};
use crate::{schemas, SensorError};

const SELF_STAT: &str = "/proc/self/stat";
/// Assumed when `AT_CLKTCK` cannot be read.
pub const DEFAULT_CLOCK_TICKS: u64 = 100;
/// Assumed when `AT_PAGESZ` cannot be read.
pub const DEFAULT_PAGE_BYTES: u64 = 4096;
/// `AT_PAGESZ` in `<linux/auxvec.h>`.
const AT_PAGESZ: usize = 6;
/// `AT_CLKTCK` in `<linux/auxvec.h>`.
const AT_CLKTCK: usize = 17;

/// Counters the producer bumps for every event and value it samples; the agent sensor turns
/// them into rates. Relaxed atomics: only the totals matter, not ordering with other memory.
///
/// The rates are of whole ticks: the producer marks the counters as each tick starts
/// ([`AgentCounters::mark_tick`]), before any sensor of that tick samples, and `gma.agent`
/// reads the marked totals. Read live, they held however many of the tick's other sensors the
/// runtime happened to run before `gma.agent` (33, 85, 119 values a second in turn for a
/// steady 80).
#[derive(Debug, Default)]
pub struct AgentCounters {
    pub values: AtomicU64,
    pub events: AtomicU64,
    /// `values` and `events` at the latest mark.
    marked_values: AtomicU64,
    marked_events: AtomicU64,
}

impl AgentCounters {
    /// Counts one sampled event carrying `values` values.
    pub fn record(&self, values: u64) {
        self.events.fetch_add(1, Ordering::Relaxed);
        self.values.fetch_add(values, Ordering::Relaxed);
    }

    /// Marks the totals so far as what `gma.agent` reports: called as a tick starts, when
    /// the samples of the ticks before it are counted and none of its own.
    pub fn mark_tick(&self) {
        let (v, e) = (
            self.values.load(Ordering::Relaxed),
            self.events.load(Ordering::Relaxed),
        );
        self.marked_values.store(v, Ordering::Relaxed);
        self.marked_events.store(e, Ordering::Relaxed);
    }

    /// Values and events counted at the latest mark.
    fn marked(&self) -> (u64, u64) {
        (
            self.marked_values.load(Ordering::Relaxed),
            self.marked_events.load(Ordering::Relaxed),
        )
    }
}

/// What `gma.agent` needs from `/proc/self/stat`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SelfStat {
    /// User CPU time, clock ticks.
    pub utime: u64,
    /// System CPU time, clock ticks.
    pub stime: u64,
    pub threads: u64,
    /// Resident pages (`rss`, field 24: what `VmRSS` of `status` shows in KiB).
    pub rss_pages: u64,
}

/// Parses `/proc/<pid>/stat`. The command name (field 2) is in parentheses and may itself
/// contain spaces and `)`, so fields are counted from the last `)`.
pub fn parse_self_stat(text: &str) -> Result<SelfStat, SensorError> {
    let close = text
        .rfind(')')
        .ok_or_else(|| SensorError::parse(SELF_STAT, 1, "no \"(comm)\" field"))?;
    // After ")": field 3 (state) comes first. The fields are taken in order from one pass (no
    // list of all fifty-two: this parse runs every second).
    let mut fields = text[close + 1..].split_ascii_whitespace();
    let mut at = 2;
    let mut field = |n: usize, what: &str| {
        let tok = fields.nth(n - at - 1);
        at = n;
        parse_num::<u64>(tok, SELF_STAT, 1, what)
    };
    Ok(SelfStat {
        utime: field(14, "utime")?,
        stime: field(15, "stime")?,
        threads: field(20, "num_threads")?,
        rss_pages: field(24, "rss")?,
    })
}

/// The `AT_CLKTCK` value of an auxiliary vector (`/proc/self/auxv`: native-endian word pairs
/// of key and value, ended by key 0). `None` when absent, zero or truncated.
pub fn parse_auxv_clock_ticks(auxv: &[u8]) -> Option<u64> {
    auxv_entry(auxv, AT_CLKTCK)
}

/// The `AT_PAGESZ` value (bytes per page) of an auxiliary vector; `None` when absent, zero or
/// truncated.
pub fn parse_auxv_page_bytes(auxv: &[u8]) -> Option<u64> {
    auxv_entry(auxv, AT_PAGESZ)
}

/// The non-zero value of `wanted` in an auxiliary vector.
fn auxv_entry(auxv: &[u8], wanted: usize) -> Option<u64> {
    const W: usize = std::mem::size_of::<usize>();
    for pair in auxv.chunks_exact(2 * W) {
        let key = usize::from_ne_bytes(pair[..W].try_into().ok()?);
        let value = usize::from_ne_bytes(pair[W..].try_into().ok()?);
        match key {
            0 => return None,
            k if k == wanted => return (value > 0).then_some(value as u64),
            _ => {}
        }
    }
    None
}

#[derive(Clone, Copy)]
struct Baseline {
    now_ns: i64,
    cpu_ticks: u64,
    values: u64,
    events: u64,
}

/// Emits `gma.agent`. The first sample only records the baseline.
pub(crate) struct Agent {
    counters: Arc<AgentCounters>,
    clock_ticks: f64,
    page_bytes: u64,
    prev: Option<Baseline>,
}

/// The `gma.agent` sensor, reading below `proc_self` (normally `/proc/self`; tests point it at
/// fixture files).
pub(crate) fn sensor(
    source: &str,
    period: Duration,
    counters: Arc<AgentCounters>,
    proc_self: &Path,
) -> ProcSensor<Agent> {
    let auxv = std::fs::read(proc_self.join("auxv")).unwrap_or_default();
    let ticks = parse_auxv_clock_ticks(&auxv).unwrap_or(DEFAULT_CLOCK_TICKS);
    let probe = Agent {
        counters,
        clock_ticks: ticks as f64,
        page_bytes: parse_auxv_page_bytes(&auxv).unwrap_or(DEFAULT_PAGE_BYTES),
        prev: None,
    };
    ProcSensor::new(source, period, proc_self, schemas::gma_agent(), probe)
}

impl Probe for Agent {
    const BUF_CAPACITY: usize = 2048;

    fn sample(&mut self, files: &mut Files, out: &mut Emit<'_>) -> Result<(), SensorError> {
        let stat = files.read("stat", parse_self_stat)?;
        let rss_kb = stat.rss_pages.saturating_mul(self.page_bytes) / 1024;
        let now_ns = out.now_ns;
        let (values, events) = self.counters.marked();
        let cur = Baseline {
            now_ns,
            cpu_ticks: stat.utime.saturating_add(stat.stime),
            values,
            events,
        };
        let Some(prev) = self.prev.replace(cur) else {
            return Ok(());
        };
        let Some(dt) = elapsed_s(prev.now_ns, now_ns) else {
            return Ok(());
        };
        let numbers = vec![
            rate(prev.cpu_ticks, cur.cpu_ticks, dt) / self.clock_ticks * 100.0,
            kib_to_mib(rss_kb),
            rate(prev.values, cur.values, dt),
            rate(prev.events, cur.events, dt),
            stat.threads as f64,
        ];
        out.push(numbers, Vec::new());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Sensor;

    const STAT_FIXTURE: &str = "4242 (gma (worker) 1) S 1 4242 4242 0 -1 4194560 19235 0 12 0 \
        250 50 0 0 20 0 7 0 123456 1048576000 4321 18446744073709551615 1 1 0 0 0 0 0 4096 17133 \
        0 0 0 17 1 0 0 0 0 0\n";

    #[test]
    fn parses_self_stat_with_awkward_comm() {
        let s = parse_self_stat(STAT_FIXTURE).unwrap();
        assert_eq!(
            s,
            SelfStat {
                utime: 250,
                stime: 50,
                threads: 7,
                rss_pages: 4321,
            }
        );
        for bad in [
            "",
            "4242 gma S 1",
            "4242 (gma) S 1 2 3",
            "4242 (gma) S 1 2 3 4 5 6 7 8 9 x 50 0 0 20 0 7",
            // ends before rss (field 24)
            "4242 (gma) S 1 2 3 4 5 6 7 8 9 10 250 50 0 0 20 0 7 0 1 2",
        ] {
            assert!(parse_self_stat(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn parses_auxv() {
        let word = |v: usize| v.to_ne_bytes();
        let mut auxv = Vec::new();
        for (k, v) in [(6usize, 4096usize), (AT_CLKTCK, 250), (0, 0)] {
            auxv.extend_from_slice(&word(k));
            auxv.extend_from_slice(&word(v));
        }
        assert_eq!(parse_auxv_clock_ticks(&auxv), Some(250));
        assert_eq!(parse_auxv_page_bytes(&auxv), Some(4096));
        assert_eq!(
            parse_auxv_clock_ticks(&auxv[..std::mem::size_of::<usize>() * 3]),
            None
        );
        assert_eq!(parse_auxv_clock_ticks(&[]), None);
        // the real one, where there is one
        if let Ok(b) = std::fs::read("/proc/self/auxv") {
            assert!(parse_auxv_clock_ticks(&b).is_some_and(|t| t > 0));
            assert!(parse_auxv_page_bytes(&b).is_some_and(|p| p.is_power_of_two()));
        }
    }

    #[test]
    fn rates_from_fixture_files() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path();
        std::fs::write(p.join("stat"), STAT_FIXTURE).unwrap();
        let counters = Arc::new(AgentCounters::default());
        let mut s = sensor("h", Duration::from_secs(1), counters.clone(), p);
        assert_eq!(
            s.probe().clock_ticks,
            DEFAULT_CLOCK_TICKS as f64,
            "no auxv in the fixture dir"
        );
        let mut out = Vec::new();
        s.sample(0, &mut out).unwrap();
        assert!(out.is_empty());
        // 2 s later: 50 more ticks (0.5 s of CPU), 30 events of 10 values
        std::fs::write(p.join("stat"), STAT_FIXTURE.replace(" 250 50 ", " 280 70 ")).unwrap();
        for _ in 0..30 {
            counters.record(10);
        }
        counters.mark_tick();
        // Sampled after the mark (the tick's own samples): counted at the next mark.
        counters.record(10);
        s.sample(2_000_000_000, &mut out).unwrap();
        // RSS: 4321 pages of 4096 bytes (no auxv: the default page) = VmRSS 17284 kB
        assert_eq!(out[0].numbers, [25.0, 17284.0 / 1024.0, 150.0, 15.0, 7.0]);
        counters.mark_tick();
        s.sample(3_000_000_000, &mut out).unwrap();
        assert_eq!(out[1].numbers[0], 0.0);
        assert_eq!(
            out[1].numbers[2..4],
            [10.0, 1.0],
            "the event sampled after the first mark"
        );
    }
}
