//! `host.bench`: a short, bounded benchmark of the host — integer and floating-point CPU
//! throughput of one thread and memory copy bandwidth — run by the agent at its start and again
//! when the host has been idle (load1 below [`IDLE_LOAD1`]) and the last run is older than the
//! configured interval. Its scores are `host.load`'s `bench_specint` / `bench_specfp`, through
//! [`BenchShare`].
//!
//! Each kernel runs for the configured budget (default 100 ms; the run is about three budgets):
//! - integer: xorshift64 steps each updating a 16 KiB table (multiply, add, index), counted
//!   per second;
//! - floating point: multiply-add and square-root steps over 256 doubles, counted per second;
//! - memory: copies between two 32 MiB buffers, bytes read plus written per second (MB/s).
//!
//! **Scale.** The scores are on the broker's reference scale (docs/broker.md): 1000 is the
//! throughput of the reference machine, [`REF_INT_STEPS_PER_S`] and [`REF_FP_STEPS_PER_S`] —
//! the project's 2-vCPU development VM (x86_64, Debian 12), measured 2026-11-26 as the medians
//! of 5 runs with 100 ms budgets (integer 4.3e8 to 6.1e8 steps/s, floating point 3.1e8 to
//! 4.1e8, memory 16 to 23 GB/s: a shared VM, at nice 19 beside other builds, so ±20 %). The
//! kernels are compiled at opt-level 3 in every profile (the workspace Cargo.toml), so a debug
//! and a release agent measure the same code. A host twice as fast per thread scores 2000. The scale is linear in throughput, so `T_exec = T_ref × P_ref / P_r` of the
//! broker holds for CPU-bound jobs; it measures one thread, not the whole host, and a busy host
//! measures low (which is why later runs wait for an idle host).

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::cpu::parse_loadavg;
use crate::procfs::{elapsed_s, Emit, Files, Probe};
use crate::SensorError;

/// Integer steps per second of the reference machine (score 1000).
pub const REF_INT_STEPS_PER_S: f64 = 5.0e8;
/// Floating-point steps per second of the reference machine (score 1000).
pub const REF_FP_STEPS_PER_S: f64 = 3.66e8;
/// A later run waits for load1 below this.
pub const IDLE_LOAD1: f64 = 0.5;
/// Bytes of each buffer of the memory kernel.
const MEM_BYTES: usize = 32 << 20;

/// The latest scores, for `host.load` (`None` before the first run).
#[derive(Debug, Default, Clone)]
pub struct BenchShare(Arc<Mutex<Option<Scores>>>);

impl BenchShare {
    pub fn get(&self) -> Option<Scores> {
        *self.0.lock()
    }

    pub(crate) fn set(&self, s: Scores) {
        *self.0.lock() = Some(s);
    }
}

/// One run's results.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Scores {
    pub specint: f64,
    pub specfp: f64,
    pub mem_mbps: f64,
    /// How long the run took.
    pub seconds: f64,
}

/// Runs the three kernels for `budget` each.
pub fn run(budget: Duration) -> Scores {
    let start = Instant::now();
    let specint = 1000.0 * int_steps_per_s(budget) / REF_INT_STEPS_PER_S;
    let specfp = 1000.0 * fp_steps_per_s(budget) / REF_FP_STEPS_PER_S;
    let mem_mbps = mem_mbps(budget);
    Scores {
        specint,
        specfp,
        mem_mbps,
        seconds: start.elapsed().as_secs_f64(),
    }
}

/// Repeats `chunk` (which does `steps` steps) until `budget` has passed; steps per second.
fn rate(budget: Duration, steps: u64, mut chunk: impl FnMut()) -> f64 {
    let start = Instant::now();
    let mut done = 0u64;
    loop {
        chunk();
        done += steps;
        if start.elapsed() >= budget {
            break;
        }
    }
    done as f64 / start.elapsed().as_secs_f64().max(1e-9)
}

fn int_steps_per_s(budget: Duration) -> f64 {
    let mut table = vec![0u32; 4096];
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let r = rate(budget, 10_000, || {
        for _ in 0..10_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let i = (x as usize) & 4095;
            table[i] = table[i].wrapping_mul(31).wrapping_add(x as u32);
        }
        black_box(&table);
    });
    black_box(x);
    r
}

fn fp_steps_per_s(budget: Duration) -> f64 {
    let mut v = vec![1.0f64; 256];
    let mut acc = 0.0f64;
    let r = rate(budget, 40 * 256, || {
        for _ in 0..40 {
            for (k, x) in v.iter_mut().enumerate() {
                *x = *x * 0.999_999 + 1e-7 * k as f64;
                acc += x.sqrt();
            }
        }
        black_box(&v);
    });
    black_box(acc);
    r
}

fn mem_mbps(budget: Duration) -> f64 {
    let src = vec![1u8; MEM_BYTES];
    let mut dst = vec![0u8; MEM_BYTES];
    // One copy reads and writes MEM_BYTES each.
    let copies_per_s = rate(budget, 1, || {
        dst.copy_from_slice(black_box(&src));
        black_box(&dst);
    });
    copies_per_s * 2.0 * MEM_BYTES as f64 / 1e6
}

/// Emits `host.bench`; see the module doc.
pub(crate) struct Bench {
    budget: Duration,
    every: Duration,
    last_ns: Option<i64>,
    share: BenchShare,
    /// The benchmark may be due at the next sample: it samples blocking (off the producer's
    /// thread), and only then runs. Between runs a sample reads nothing; once due, each
    /// sample reads `/proc/loadavg` on the producer's own thread until the host is idle.
    armed: bool,
}

impl Bench {
    pub(crate) fn new(budget: Duration, every: Duration, share: BenchShare) -> Bench {
        Bench {
            budget,
            every,
            last_ns: None,
            share,
            armed: true,
        }
    }
}

impl Probe for Bench {
    fn blocking(&self) -> bool {
        self.armed
    }

    fn sample(&mut self, files: &mut Files, out: &mut Emit<'_>) -> Result<(), SensorError> {
        let every = self.every.as_secs_f64();
        // `/proc/loadavg` is read only once the interval has passed (not every second).
        let due = match self.last_ns {
            None => true,
            Some(last) => {
                elapsed_s(last, out.now_ns).is_some_and(|s| s >= every)
                    && files.read("loadavg", parse_loadavg)?.load1 < IDLE_LOAD1
            }
        };
        if due && self.armed {
            let s = run(self.budget);
            self.share.set(s);
            self.last_ns = Some(out.now_ns);
            out.push(vec![s.specint, s.specfp, s.mem_mbps, s.seconds], Vec::new());
        }
        // Armed when the next sample, a period on, may be due.
        let next = out
            .now_ns
            .saturating_add(i64::try_from(out.period.as_nanos()).unwrap_or(i64::MAX));
        self.armed = self
            .last_ns
            .is_none_or(|last| elapsed_s(last, next).is_some_and(|s| s >= every));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Sensor;

    #[test]
    fn scores_are_positive_and_finite() {
        let s = run(Duration::from_millis(20));
        for v in [s.specint, s.specfp, s.mem_mbps, s.seconds] {
            assert!(v.is_finite() && v > 0.0, "{s:?}");
        }
    }

    #[test]
    fn runs_at_start_then_only_when_idle_and_due() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path();
        let share = BenchShare::default();
        let mut s = crate::procfs::ProcSensor::new(
            "h",
            Duration::from_secs(1),
            p,
            crate::schemas::host_bench(),
            Bench::new(Duration::from_millis(5), Duration::from_secs(3600), share.clone()),
        );
        assert!(s.blocking());
        let sec = 1_000_000_000i64;
        let busy = "3.00 1.00 0.50 3/200 999\n";
        let idle = "0.10 1.00 0.50 3/200 999\n";
        std::fs::write(p.join("loadavg"), busy).unwrap();
        let mut out = Vec::new();
        assert_eq!(share.get(), None);
        s.sample(0, &mut out).unwrap();
        assert_eq!(out.len(), 1, "at start, busy or not");
        let first = share.get().unwrap();
        assert_eq!(out[0].numbers[..2], [first.specint, first.specfp]);
        assert!(
            !s.blocking(),
            "not due within a period: checked on the producer's thread"
        );
        s.sample(10 * sec, &mut out).unwrap();
        assert!(!s.blocking());
        s.sample(3599 * sec, &mut out).unwrap();
        assert!(s.blocking(), "may be due at the next sample");
        s.sample(4000 * sec, &mut out).unwrap();
        assert_eq!(out.len(), 1, "not before the interval, not while busy");
        assert!(s.blocking(), "due, waiting for an idle host");
        std::fs::write(p.join("loadavg"), idle).unwrap();
        s.sample(4001 * sec, &mut out).unwrap();
        assert_eq!(out.len(), 2, "idle and due");
        assert!(!s.blocking());
        std::fs::remove_file(p.join("loadavg")).unwrap();
        s.sample(4002 * sec, &mut out).unwrap();
        assert_eq!(out.len(), 2, "not due: loadavg not read");
        assert!(s.sample(9000 * sec, &mut out).is_err(), "due: loadavg read");
    }
}
