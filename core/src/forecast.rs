//! NWS-style (Network Weather Service) adaptive forecaster for one numeric series.
//!
//! A [`Forecaster`] runs a small family of cheap predictors side by side over the same series and,
//! at every step, scores each predictor's previous prediction against the value that actually
//! arrived. Each predictor keeps two error measures:
//!
//! * `mae32` — its mean absolute error over the last [`ERROR_WINDOW`] predictions (an exact
//!   sliding window), which reacts quickly when the series changes character;
//! * `mae_long` — a long-memory, exponentially decayed mean absolute error,
//!   `mae_long += LONG_GAIN · (|e| − mae_long)` with [`LONG_GAIN`] = 0.005 (a memory of about 200
//!   predictions), initialised with the first error.
//!
//! The forecast it serves is the one of the predictor with the lowest score
//! `(mae32 + mae_long) / 2` (ties go to the earlier predictor, so to `last` first). A 32-sample
//! window alone is noisy: on series where `last` is nearly optimal the window keeps handing the
//! forecast to whichever smoother happened to be lucky over the last 32 steps, and the served error
//! ends up several percent worse than `last`'s. The long-memory half damps that churn, the window
//! half keeps the selection adaptive. The `mae` reported with a forecast is still the 32-window MAE
//! of the chosen predictor.
//!
//! The equal split was chosen by replaying 5000-step traces (the ten test seeds and 40 held-out
//! seeds). Against the window-only rule it keeps the served MAE below `last`'s on every
//! [`synthetic_load_trace`] (about −4.5 % instead of −2.5 % on average), brings it from +2.5…4 %
//! to at most +0.7 % of `last` on [`synthetic_load_trace_low_noise`] and from +1.5 % to at most
//! +0.7 % on a pure random walk, and costs 1–3 % on a series that switches between a random walk
//! and noise around a constant every 100–1000 steps. Giving the long memory more weight (¾ or all
//! of the score) gains a few tenths of a percent on the stationary traces but makes such regime
//! switches noticeably slower to follow (3–6 % worse than the window alone). A hysteresis ("keep
//! `last` unless another predictor scores better by 1–5 %", or "keep the current choice unless …")
//! only traded a gain on one trace for a loss on another, so none is used.
//!
//! Predictors, in tie-break order ([`Forecaster::methods`]):
//!
//! | name       | prediction of the next value                                   |
//! |------------|----------------------------------------------------------------|
//! | `last`     | the last value                                                 |
//! | `mean`     | running mean of every value seen                               |
//! | `mean20`   | mean of the last 20 values                                     |
//! | `median5`  | median of the last 5 values                                    |
//! | `median21` | median of the last 21 values                                   |
//! | `expG`     | exponential smoothing `s += G·(x − s)`, G ∈ {0.05, 0.1, 0.2, 0.4, 0.8} |
//!
//! Windowed predictors use what they have while their window fills (the mean or median of the
//! values seen so far); exponential smoothing starts at the first value.
//!
//! The module is pure: no clock, no I/O. Non-finite observations (NaN, ±∞) are ignored — not
//! counted and not allowed to poison any state. [`evaluate`] replays a trace and reports how the
//! served forecast compares with each fixed predictor; [`synthetic_load_trace`] and
//! [`synthetic_load_trace_low_noise`] produce deterministic CPU-load-like traces for such
//! comparisons.

/// Names of the predictors, in tie-break order (`last` wins ties).
const METHODS: [&str; N_METHODS] = [
    "last", "mean", "mean20", "median5", "median21", "exp0.05", "exp0.1", "exp0.2", "exp0.4", "exp0.8",
];
const N_METHODS: usize = 10;
const LAST: usize = 0;
const MEAN: usize = 1;
const MEAN20: usize = 2;
const MEDIAN5: usize = 3;
const MEDIAN21: usize = 4;
/// Index of the first exponential-smoothing predictor; `GAINS[i]` belongs to `EXP0 + i`.
const EXP0: usize = 5;
const GAINS: [f64; 5] = [0.05, 0.1, 0.2, 0.4, 0.8];

/// Values kept for the sliding predictors (the longest window, `median21`).
const HISTORY: usize = 21;

/// Number of most recent predictions over which each predictor's mean absolute error is taken.
pub const ERROR_WINDOW: usize = 32;

/// Gain of each predictor's long-memory (exponentially decayed) mean absolute error.
pub const LONG_GAIN: f64 = 0.005;

/// Adaptive forecaster for one series.
///
/// Memory: fixed-size arrays only, no heap — 21 recent values (`f64`, 168 B), the running mean and
/// sample count (16 B), five smoothing states (40 B), the last 32 absolute errors of each of the
/// 10 predictors stored as `f32` (1280 B), the long-memory MAE of each predictor (`f64`, 80 B),
/// plus 4 B of ring indices (padded to 8): 1592 B in all (`size_of::<Forecaster>()`, checked by a
/// test). Window errors are kept as `f32` (relative precision ~6e-8, more than enough to rank
/// predictors); the window MAE sums are formed in `f64` from the stored window at each
/// [`forecast`](Forecaster::forecast), so they never drift. The long-memory MAEs are a convex
/// update of finite values (an infinite error counts as `f64::MAX` there), so they stay finite.
#[derive(Debug, Clone)]
pub struct Forecaster {
    /// Ring of the most recent values; `hist_head` is the next slot to write.
    history: [f64; HISTORY],
    hist_head: u8,
    hist_len: u8,
    /// Running mean of every observation.
    mean: f64,
    /// Exponential smoothing states, one per gain.
    exp: [f64; GAINS.len()],
    /// Observations counted (finite ones).
    samples: u64,
    /// `errors[m]` is a ring of predictor `m`'s last absolute errors; all rings share `err_head`.
    errors: [[f32; ERROR_WINDOW]; N_METHODS],
    /// Long-memory (exponentially decayed, gain [`LONG_GAIN`]) MAE of each predictor; meaningful
    /// once `err_len > 0`.
    err_long: [f64; N_METHODS],
    err_head: u8,
    err_len: u8,
}

/// A forecast of the next value of a series.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Forecast {
    /// The predicted next value.
    pub value: f64,
    /// The predictor's mean absolute error over its last (up to [`ERROR_WINDOW`]) predictions;
    /// NaN while no prediction has been scored yet (after exactly one observation).
    pub mae: f64,
    /// Name of the predictor that made the forecast (one of [`Forecaster::methods`]).
    pub method: &'static str,
    /// Observations counted so far.
    pub samples: u64,
}

impl Default for Forecaster {
    fn default() -> Self {
        Self::new()
    }
}

impl Forecaster {
    pub fn new() -> Forecaster {
        Forecaster {
            history: [0.0; HISTORY],
            hist_head: 0,
            hist_len: 0,
            mean: 0.0,
            exp: [0.0; GAINS.len()],
            samples: 0,
            errors: [[0.0; ERROR_WINDOW]; N_METHODS],
            err_long: [0.0; N_METHODS],
            err_head: 0,
            err_len: 0,
        }
    }

    /// Names of the predictors, in tie-break order.
    pub fn methods() -> &'static [&'static str] {
        &METHODS
    }

    /// Observations counted so far.
    pub fn samples(&self) -> u64 {
        self.samples
    }

    /// Feeds the next observation: first scores every predictor's previous prediction against `x`
    /// (absolute error), then updates every predictor with `x`. Non-finite `x` is ignored.
    pub fn observe(&mut self, x: f64) {
        if !x.is_finite() {
            return;
        }
        if self.samples > 0 {
            let preds = self.predictions();
            let slot = usize::from(self.err_head);
            let first = self.err_len == 0;
            for ((ring, long), p) in self.errors.iter_mut().zip(&mut self.err_long).zip(preds) {
                let e = (p - x).abs();
                // An overflowing or undefined error (only possible near f64::MAX) counts as huge:
                // infinite in the window, f64::MAX in the long memory (which must stay finite so
                // that its update never computes ∞ − ∞).
                let e_window = e as f32;
                ring[slot] = if e_window.is_nan() {
                    f32::INFINITY
                } else {
                    e_window
                };
                let e_long = if e.is_finite() { e } else { f64::MAX };
                *long = if first {
                    e_long
                } else {
                    // A convex combination of two values in [0, f64::MAX]: cannot overflow.
                    *long + LONG_GAIN * (e_long - *long)
                };
            }
            self.err_head = ((slot + 1) % ERROR_WINDOW) as u8;
            if usize::from(self.err_len) < ERROR_WINDOW {
                self.err_len += 1;
            }
        }

        let head = usize::from(self.hist_head);
        self.history[head] = x;
        self.hist_head = ((head + 1) % HISTORY) as u8;
        if usize::from(self.hist_len) < HISTORY {
            self.hist_len += 1;
        }

        self.samples += 1;
        if self.samples == 1 {
            self.mean = x;
            self.exp = [x; GAINS.len()];
        } else {
            let n = self.samples as f64;
            // m + (x − m)/n written so that it cannot overflow for finite inputs.
            self.mean = self.mean - self.mean / n + x / n;
            for (s, g) in self.exp.iter_mut().zip(GAINS) {
                *s = g * x + (1.0 - g) * *s;
            }
        }
    }

    /// The prediction of the next value by the predictor with the lowest score
    /// `(mae32 + mae_long) / 2` (see the [module docs](self)), with that predictor's 32-window MAE.
    /// Ties go to the earlier predictor in [`methods`](Self::methods) order. Before any prediction
    /// has been scored, `last` is served (with `mae` NaN). None before the first observation.
    pub fn forecast(&self) -> Option<Forecast> {
        if self.samples == 0 {
            return None;
        }
        let preds = self.predictions();
        let Some(maes) = self.maes() else {
            return Some(self.make(LAST, preds[LAST], f64::NAN));
        };
        let mut scores = [0.0; N_METHODS];
        for ((s, &mae), &long) in scores.iter_mut().zip(&maes).zip(&self.err_long) {
            // Halves first: the sum of two values near f64::MAX would overflow (∞ still ranks
            // correctly, but this keeps finite scores finite). Never NaN: both are ≥ 0, not NaN.
            *s = mae / 2.0 + long / 2.0;
        }
        let mut best = LAST;
        for (m, &score) in scores.iter().enumerate().skip(1) {
            if score < scores[best] {
                best = m;
            }
        }
        Some(self.make(best, preds[best], maes[best]))
    }

    /// Same as [`forecast`](Self::forecast) for one fixed predictor by method name (for
    /// comparisons). None for an unknown name or before the first observation; `mae` is NaN while
    /// no prediction has been scored.
    pub fn forecast_by(&self, method: &str) -> Option<Forecast> {
        let m = METHODS.iter().position(|&name| name == method)?;
        if self.samples == 0 {
            return None;
        }
        let mae = self.maes().map_or(f64::NAN, |maes| maes[m]);
        Some(self.make(m, self.predictions()[m], mae))
    }

    fn make(&self, m: usize, value: f64, mae: f64) -> Forecast {
        Forecast {
            value,
            mae,
            method: METHODS[m],
            samples: self.samples,
        }
    }

    /// Window (last [`ERROR_WINDOW`]) MAE of every predictor; None while nothing has been scored.
    fn maes(&self) -> Option<[f64; N_METHODS]> {
        let len = usize::from(self.err_len);
        if len == 0 {
            return None;
        }
        let mut out = [0.0; N_METHODS];
        for (o, ring) in out.iter_mut().zip(&self.errors) {
            // When the ring is not yet full its entries are exactly the first `len` slots.
            *o = ring[..len].iter().map(|&e| f64::from(e)).sum::<f64>() / len as f64;
        }
        Some(out)
    }

    /// Every predictor's prediction of the next value. Only meaningful once `samples > 0`.
    fn predictions(&self) -> [f64; N_METHODS] {
        let mut recent = [0.0; HISTORY];
        let len = usize::from(self.hist_len);
        let head = usize::from(self.hist_head);
        // recent[0] is the newest value, recent[len - 1] the oldest kept.
        for (j, r) in recent.iter_mut().take(len).enumerate() {
            *r = self.history[(head + HISTORY - 1 - j) % HISTORY];
        }
        let recent = &recent[..len];

        let mut p = [0.0; N_METHODS];
        p[LAST] = recent.first().copied().unwrap_or(0.0);
        p[MEAN] = self.mean;
        p[MEAN20] = mean_of(&recent[..len.min(20)]);
        p[MEDIAN5] = median_of(&recent[..len.min(5)]);
        p[MEDIAN21] = median_of(&recent[..len.min(21)]);
        p[EXP0..].copy_from_slice(&self.exp);
        p
    }
}

/// Mean that cannot overflow for finite inputs; 0 for an empty slice.
fn mean_of(v: &[f64]) -> f64 {
    let n = v.len() as f64;
    v.iter().map(|x| x / n).sum()
}

/// Median (mean of the two middle values for an even count); 0 for an empty slice.
fn median_of(v: &[f64]) -> f64 {
    let mut buf = [0.0; HISTORY];
    let n = v.len().min(HISTORY);
    if n == 0 {
        return 0.0;
    }
    buf[..n].copy_from_slice(&v[..n]);
    let s = &mut buf[..n];
    s.sort_unstable_by(f64::total_cmp);
    if n % 2 == 1 {
        s[n / 2]
    } else {
        s[n / 2 - 1] / 2.0 + s[n / 2] / 2.0
    }
}

/// Result of replaying a trace through a [`Forecaster`] ([`evaluate`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Evaluation {
    /// Mean absolute error of the served (adaptive) forecast.
    pub served_mae: f64,
    /// Mean absolute error of each fixed predictor, in [`Forecaster::methods`] order.
    pub by_method: Vec<(&'static str, f64)>,
    /// Number of scored steps.
    pub n: usize,
}

impl Evaluation {
    /// The MAE of one fixed predictor by name.
    pub fn method_mae(&self, method: &str) -> Option<f64> {
        self.by_method.iter().find(|(m, _)| *m == method).map(|&(_, e)| e)
    }
}

/// Runs a [`Forecaster`] over `trace`: for each step t ≥ 1, the forecast made before observing
/// `trace[t]` is compared with `trace[t]`. Non-finite entries are neither scored nor observed.
/// The MAEs are NaN when no step could be scored (`n == 0`).
pub fn evaluate(trace: &[f64]) -> Evaluation {
    let mut f = Forecaster::new();
    let mut served = 0.0;
    let mut per = [0.0; N_METHODS];
    let mut n = 0usize;
    for &x in trace {
        if !x.is_finite() {
            continue;
        }
        if let Some(fc) = f.forecast() {
            served += (fc.value - x).abs();
            for (acc, p) in per.iter_mut().zip(f.predictions()) {
                *acc += (p - x).abs();
            }
            n += 1;
        }
        f.observe(x);
    }
    let div = |s: f64| if n == 0 { f64::NAN } else { s / n as f64 };
    Evaluation {
        served_mae: div(served),
        by_method: METHODS.iter().zip(per).map(|(&m, s)| (m, div(s))).collect(),
        n,
    }
}

/// A deterministic, realistic CPU-load-like trace (percent, clamped to [0, 100]).
///
/// The underlying load is AR(1) (φ = 0.9, innovation σ = 2) reverting to a level that jumps to a
/// new uniform value in [5, 85] with probability 0.002 per step; each observation adds Gaussian
/// sampling noise (σ = 3, the jitter of sampling bursty work once a second) and, with probability
/// 0.01 per step, a spike of +20…60 starts and lasts 1–5 steps. The same `(n, seed)` always gives
/// the same trace.
///
/// See [`synthetic_load_trace_low_noise`] for a variant on which `last` is the best predictor.
pub fn synthetic_load_trace(n: usize, seed: u64) -> Vec<f64> {
    load_trace(n, seed, 2.0, 3.0)
}

/// Like [`synthetic_load_trace`], but with a stronger underlying load (AR(1) innovation σ = 2.5
/// instead of 2) and much less sampling noise (σ = 1.5 instead of 3): the series is close to a
/// random walk with spikes and level jumps, the last value is (nearly) the best fixed predictor,
/// and the adaptive forecast can at best match it. The same `(n, seed)` always gives the same
/// trace.
pub fn synthetic_load_trace_low_noise(n: usize, seed: u64) -> Vec<f64> {
    load_trace(n, seed, 2.5, 1.5)
}

/// The generator behind the synthetic load traces: AR(1) innovation σ `innovation` and Gaussian
/// sampling noise σ `noise`; everything else as described at [`synthetic_load_trace`].
fn load_trace(n: usize, seed: u64, innovation: f64, noise: f64) -> Vec<f64> {
    let mut rng = SplitMix64::new(seed);
    let mut level = 20.0 + 50.0 * rng.uniform();
    let mut state = level;
    let mut spike_left = 0u32;
    let mut spike_height = 0.0;
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        if rng.uniform() < 0.002 {
            level = 5.0 + 80.0 * rng.uniform();
        }
        state = level + 0.9 * (state - level) + innovation * rng.normal();
        if spike_left == 0 && rng.uniform() < 0.01 {
            spike_left = 1 + (rng.uniform() * 5.0) as u32;
            spike_height = 20.0 + 40.0 * rng.uniform();
        }
        let mut v = state + noise * rng.normal();
        if spike_left > 0 {
            v += spike_height;
            spike_left -= 1;
        }
        out.push(v.clamp(0.0, 100.0));
    }
    out
}

/// SplitMix64: tiny, fast, good enough for synthetic traces; not for anything secret.
struct SplitMix64(u64);

impl SplitMix64 {
    fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Standard normal (Box–Muller).
    fn normal(&mut self) -> f64 {
        let u1 = 1.0 - self.uniform(); // (0, 1]
        let u2 = self.uniform();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn random_walk(n: usize, seed: u64) -> Vec<f64> {
        let mut rng = SplitMix64::new(seed);
        let mut x = 50.0;
        (0..n)
            .map(|_| {
                x += rng.normal();
                x
            })
            .collect()
    }

    #[test]
    fn memory_is_small() {
        let size = std::mem::size_of::<Forecaster>();
        assert!(size <= 1638, "Forecaster is {size} bytes (budget ~1.6 KiB)");
        assert_eq!(size, 1592);
    }

    #[test]
    fn empty_and_first_observation() {
        let mut f = Forecaster::new();
        assert!(f.forecast().is_none());
        assert!(f.forecast_by("last").is_none());
        f.observe(f64::NAN);
        f.observe(f64::INFINITY);
        assert!(f.forecast().is_none());
        f.observe(7.0);
        let fc = f.forecast().unwrap();
        assert_eq!(fc.method, "last");
        assert_eq!(fc.value, 7.0);
        assert!(fc.mae.is_nan());
        assert_eq!(fc.samples, 1);
        for m in Forecaster::methods() {
            assert_eq!(f.forecast_by(m).unwrap().value, 7.0, "{m}");
        }
        assert!(f.forecast_by("nope").is_none());
    }

    #[test]
    fn constant_series_ties_go_to_last() {
        let mut f = Forecaster::new();
        for _ in 0..100 {
            f.observe(3.5);
        }
        let fc = f.forecast().unwrap();
        assert_eq!(fc.method, "last");
        assert_eq!(fc.value, 3.5);
        assert_eq!(fc.mae, 0.0);
        assert_eq!(fc.samples, 100);
    }

    #[test]
    fn predictors_compute_what_they_say() {
        let mut f = Forecaster::new();
        for x in 1..=30 {
            f.observe(f64::from(x));
        }
        let v = |m: &str| f.forecast_by(m).unwrap().value;
        assert_eq!(v("last"), 30.0);
        assert!((v("mean") - 15.5).abs() < 1e-12);
        assert!((v("mean20") - 20.5).abs() < 1e-12); // 11..=30
        assert_eq!(v("median5"), 28.0); // 26..=30
        assert_eq!(v("median21"), 20.0); // 10..=30
                                         // exp0.8 tracks closely, exp0.05 lags far behind.
        assert!(v("exp0.8") > 29.0 && v("exp0.8") < 30.0);
        assert!(v("exp0.05") < v("exp0.1") && v("exp0.1") < v("exp0.2"));
        // On a ramp the last value has the smallest error (exactly 1 per step).
        let fc = f.forecast().unwrap();
        assert_eq!(fc.method, "last");
        assert_eq!(fc.mae, 1.0);
    }

    #[test]
    fn median_with_even_count_while_filling() {
        let mut f = Forecaster::new();
        for x in [1.0, 10.0, 2.0, 4.0] {
            f.observe(x);
        }
        assert_eq!(f.forecast_by("median5").unwrap().value, 3.0);
        assert_eq!(f.forecast_by("mean20").unwrap().value, 4.25);
    }

    #[test]
    fn error_window_is_exact_and_slides() {
        // Alternating 0/10: `last` is always off by 10, `mean` (→5) by about 5.
        let mut f = Forecaster::new();
        for i in 0..200 {
            f.observe(if i % 2 == 0 { 0.0 } else { 10.0 });
        }
        assert_eq!(f.forecast_by("last").unwrap().mae, 10.0);
        assert_ne!(f.forecast().unwrap().method, "last");
        // Then a constant: after ERROR_WINDOW + 1 steps every memory of the alternation is gone
        // from `last`'s window, so its window MAE is exactly 0.
        for _ in 0..=ERROR_WINDOW {
            f.observe(10.0);
        }
        let fc = f.forecast_by("last").unwrap();
        assert_eq!(fc.mae, 0.0);
        // The long memory still remembers that `last` was off by 10 throughout the alternation
        // while exp0.4 was off by only 6.25, so exp0.4 (which has converged onto the constant too)
        // keeps the forecast: the selection is not flipped by 33 steps, but the served value is
        // the constant all the same.
        let fc = f.forecast().unwrap();
        assert_eq!(fc.method, "exp0.4");
        assert!((fc.value - 10.0).abs() < 1e-6, "{fc:?}");
        for _ in 0..200 {
            f.observe(10.0);
        }
        let fc = f.forecast().unwrap();
        assert_eq!((fc.value, fc.mae), (10.0, 0.0), "{fc:?}");
    }

    #[test]
    fn nan_does_not_poison() {
        let mut f = Forecaster::new();
        let mut g = Forecaster::new();
        for x in 0..50 {
            let x = f64::from(x % 7);
            f.observe(x);
            f.observe(f64::NAN);
            f.observe(f64::NEG_INFINITY);
            g.observe(x);
        }
        assert_eq!(f.forecast(), g.forecast());
        for m in Forecaster::methods() {
            assert_eq!(f.forecast_by(m), g.forecast_by(m));
        }
    }

    #[test]
    fn extreme_values_do_not_produce_nan() {
        let mut f = Forecaster::new();
        for x in [f64::MAX, -f64::MAX, f64::MAX, 1.0, -f64::MAX] {
            f.observe(x);
        }
        for m in Forecaster::methods() {
            let fc = f.forecast_by(m).unwrap();
            assert!(!fc.value.is_nan() && !fc.mae.is_nan(), "{m}: {fc:?}");
        }
        assert!(
            f.err_long.iter().all(|e| e.is_finite() && *e >= 0.0),
            "{:?}",
            f.err_long
        );
        let fc = f.forecast().unwrap();
        assert!(!fc.value.is_nan() && !fc.mae.is_nan(), "{fc:?}");
        // And the forecaster recovers to ordinary values.
        for _ in 0..(3 * ERROR_WINDOW) {
            f.observe(1.0);
        }
        assert!(f.err_long.iter().all(|e| e.is_finite()));
        assert!((f.forecast().unwrap().value - 1.0).abs() < 1e-9);
    }

    #[test]
    fn synthetic_trace_is_deterministic_and_in_range() {
        for gen in [synthetic_load_trace, synthetic_load_trace_low_noise] {
            let a = gen(2000, 42);
            assert_eq!(a, gen(2000, 42));
            assert_ne!(a, gen(2000, 43));
            assert!(a.iter().all(|v| (0.0..=100.0).contains(v)));
            assert!(gen(0, 1).is_empty());
        }
        assert_ne!(
            synthetic_load_trace(100, 7),
            synthetic_load_trace_low_noise(100, 7)
        );
    }

    #[test]
    fn long_memory_mae_starts_at_first_error_and_decays() {
        let mut f = Forecaster::new();
        f.observe(0.0);
        f.observe(10.0);
        assert_eq!(f.err_long[LAST], 10.0); // initialised with the first error, not decayed from 0
        f.observe(10.0);
        assert_eq!(f.err_long[LAST], 10.0 + LONG_GAIN * (0.0 - 10.0));
        // The served `mae` is the window MAE, not the score: (10 + 0) / 2.
        assert_eq!(f.forecast_by("last").unwrap().mae, 5.0);
    }

    #[test]
    fn long_memory_outvotes_a_short_lucky_streak() {
        // A long ramp of slope 2: `last` is off by exactly 2 every step, exp0.4 (lagging by 3) by
        // 3. Then ERROR_WINDOW steps alternating ±0.5 around the last value: there `last` is off
        // by 1 per step and exp0.4 by about 0.63, so over the window exp0.4 looks better — but
        // over the long history `last` has been much better, and the combined score keeps it.
        let mut f = Forecaster::new();
        for i in 0..1000 {
            f.observe(2.0 * f64::from(i));
        }
        assert_eq!(f.forecast().unwrap().method, "last");
        let level = f.forecast_by("last").unwrap().value;
        let alternate = |i: usize| level + if i.is_multiple_of(2) { 0.5 } else { -0.5 };
        for i in 0..ERROR_WINDOW {
            f.observe(alternate(i));
        }
        let window = f.maes().unwrap();
        let window_best = (1..N_METHODS).fold(LAST, |b, m| if window[m] < window[b] { m } else { b });
        assert_eq!(METHODS[window_best], "exp0.4", "window MAEs {window:?}");
        let fc = f.forecast().unwrap();
        assert_eq!(fc.method, "last");
        assert_eq!(fc.mae, window[LAST]); // the served `mae` is the window MAE, not the score
                                          // If the new behaviour persists, the selection does follow it.
        for i in ERROR_WINDOW..(ERROR_WINDOW + 300) {
            f.observe(alternate(i));
        }
        assert_ne!(f.forecast().unwrap().method, "last");
    }

    #[test]
    fn evaluate_edge_cases() {
        let e = evaluate(&[]);
        assert_eq!(e.n, 0);
        assert!(e.served_mae.is_nan());
        let e = evaluate(&[1.0, f64::NAN, 3.0, 3.0]);
        assert_eq!(e.n, 2);
        assert_eq!(e.method_mae("last"), Some(1.0)); // |1-3| then |3-3|
        assert_eq!(e.served_mae, 1.0);
        assert_eq!(e.by_method.len(), Forecaster::methods().len());
    }

    const SEEDS: [u64; 10] = [1, 2, 3, 4, 5, 6, 7, 8, 42, 1234];

    /// Evaluates `trace`, prints served vs `last` vs the best fixed predictor, and returns
    /// `(served, last)`.
    fn report(label: &str, seed: u64, trace: &[f64]) -> (f64, f64) {
        let e = evaluate(trace);
        assert_eq!(e.n, trace.len() - 1);
        let last = e.method_mae("last").unwrap();
        let (best_name, best) =
            e.by_method
                .iter()
                .copied()
                .fold(("", f64::INFINITY), |a, b| if b.1 < a.1 { b } else { a });
        println!(
            "{label} seed {seed:>4}: served MAE {:.4}  last {:.4}  best fixed {:.4} ({best_name})  \
             ({:+.2}% vs last)",
            e.served_mae,
            last,
            best,
            100.0 * (e.served_mae / last - 1.0)
        );
        (e.served_mae, last)
    }

    #[test]
    fn served_beats_last_on_synthetic_load() {
        for seed in SEEDS {
            let (served, last) = report("load          ", seed, &synthetic_load_trace(5000, seed));
            assert!(served <= last, "seed {seed}: served {served} > last {last}");
        }
    }

    #[test]
    fn served_close_to_last_on_low_noise_load() {
        // Here `last` is (nearly) the best fixed predictor; the window-only selection was 2.6–3.8 %
        // worse than `last` on these seeds.
        for seed in SEEDS {
            let trace = synthetic_load_trace_low_noise(5000, seed);
            let (served, last) = report("low-noise load", seed, &trace);
            assert!(
                served <= 1.02 * last,
                "seed {seed}: served {served} vs last {last}"
            );
        }
    }

    #[test]
    fn served_close_to_last_on_random_walk() {
        // `last` is the optimal predictor of a random walk.
        for seed in [1, 2, 3] {
            let (served, last) = report("random walk   ", seed, &random_walk(5000, seed));
            assert!(
                served <= 1.02 * last,
                "seed {seed}: served {served} vs last {last}"
            );
        }
    }
}
