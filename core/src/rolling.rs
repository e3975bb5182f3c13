//! Rolling-window summaries (mean, min, max) for one series with several numeric fields.
//!
//! A [`Rolling`] keeps one [`Window`] as a ring of `buckets` fixed-width buckets; each holds its
//! start and, per field, the count, sum, min and max of the samples that fell into it. Buckets are
//! aligned to multiples of the bucket width (`ts.div_euclid(width) * width`, ns since the epoch), so
//! every producer summarising the same series cuts the same buckets.
//!
//! Precision: the window edge is at bucket granularity. [`Rolling::summary`] includes whole buckets
//! whose start lies in `(now − span, now]`, so what it covers is between `span − width` and `span`
//! (e.g. between 55 s and 60 s for `1m`, whose buckets are 5 s wide); samples in the part of the
//! oldest bucket that the window edge cuts are left out, never half-counted. `covered_ns` says how
//! much was actually covered.
//!
//! The module is pure: no clock (callers pass timestamps), no I/O. Non-finite values (NaN, ±∞)
//! are skipped for their field only, and a sample with no finite value at all is not counted.

const SEC: i64 = 1_000_000_000;

/// A rolling window: `span_ns` split into `buckets` buckets of `span_ns / buckets`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    pub name: &'static str,
    pub span_ns: i64,
    pub buckets: usize,
}

impl Window {
    /// Width of one bucket (at least 1 ns).
    pub fn bucket_ns(&self) -> i64 {
        let n = i64::try_from(self.buckets.max(1)).unwrap_or(i64::MAX);
        (self.span_ns / n).max(1)
    }
}

/// The standard windows: `1m` (12 × 5 s), `10m` (20 × 30 s), `60m` (30 × 120 s).
pub const WINDOWS: [Window; 3] = [
    Window {
        name: "1m",
        span_ns: 60 * SEC,
        buckets: 12,
    },
    Window {
        name: "10m",
        span_ns: 600 * SEC,
        buckets: 20,
    },
    Window {
        name: "60m",
        span_ns: 3600 * SEC,
        buckets: 30,
    },
];

/// One of [`WINDOWS`] by name: `"1m"`, `"10m"` or `"60m"`.
pub fn window(name: &str) -> Option<Window> {
    WINDOWS.iter().find(|w| w.name == name).copied()
}

/// Rolling summaries of one window over `fields` numeric fields.
///
/// Memory: `buckets × (16 + fields × 32)` bytes plus a small header (e.g. 1m with 4 fields:
/// 12 × 144 B ≈ 1.7 KiB), allocated once in [`new`](Rolling::new).
#[derive(Debug, Clone)]
pub struct Rolling {
    window: Window,
    /// Bucket width, ns (≥ 1).
    width: i64,
    /// Ring length (≥ 1).
    nb: usize,
    /// Effective span: `width × nb` (equals `window.span_ns` when that divides evenly).
    span: i64,
    fields: usize,
    /// Start of the newest bucket; None until the first counted sample.
    newest: Option<i64>,
    /// Largest timestamp counted (always inside the newest bucket).
    latest_ts: i64,
    /// Per slot: bucket start and samples counted.
    starts: Vec<i64>,
    samples: Vec<u64>,
    /// Per slot and field (`slot * fields + field`).
    count: Vec<u64>,
    sum: Vec<f64>,
    min: Vec<f64>,
    max: Vec<f64>,
}

/// Summary of a window at some instant (see [`Rolling::summary`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    /// Per field: mean of its finite samples, NaN if it has none.
    pub mean: Vec<f64>,
    /// Per field: smallest sample, NaN if none.
    pub min: Vec<f64>,
    /// Per field: largest sample, NaN if none.
    pub max: Vec<f64>,
    /// Samples counted in the included buckets.
    pub samples: u64,
    /// `now − start of the oldest included bucket`, at most the span.
    pub covered_ns: i64,
}

impl Rolling {
    /// A rolling summary of `window` over `fields` fields. A window whose span does not divide
    /// evenly into its buckets uses `bucket_ns() × buckets` as its span; zero buckets count as one.
    pub fn new(window: Window, fields: usize) -> Rolling {
        let nb = window.buckets.max(1);
        let width = window.bucket_ns();
        let span = width.saturating_mul(i64::try_from(nb).unwrap_or(i64::MAX));
        let cells = nb.saturating_mul(fields);
        Rolling {
            window,
            width,
            nb,
            span,
            fields,
            newest: None,
            latest_ts: 0,
            starts: vec![i64::MIN; nb],
            samples: vec![0; nb],
            count: vec![0; cells],
            sum: vec![0.0; cells],
            min: vec![f64::INFINITY; cells],
            max: vec![f64::NEG_INFINITY; cells],
        }
    }

    pub fn window(&self) -> Window {
        self.window
    }

    pub fn fields(&self) -> usize {
        self.fields
    }

    /// Adds one sample: `values[f]` for field `f`. A non-finite value is skipped for that field
    /// only; extra values are ignored and missing ones count as NaN; a sample with no finite value
    /// for any field is ignored.
    ///
    /// Timestamps: a sample in a later bucket advances the window (a gap of a whole span or more
    /// starts afresh). Time going backwards by less than a bucket width (relative to the latest
    /// timestamp counted) goes into the current bucket; further back, the sample goes into its own
    /// bucket if that bucket is still in the ring (start > newest bucket's start − span) and is
    /// ignored otherwise.
    pub fn add(&mut self, ts_ns: i64, values: &[f64]) {
        let values = &values[..values.len().min(self.fields)];
        if !values.iter().any(|v| v.is_finite()) {
            return;
        }
        // Within one bucket of i64::MIN the bucket start is not representable: ignore the sample.
        let Some(mut start) = self.align(ts_ns) else {
            return;
        };
        match self.newest {
            None => self.reset(start, ts_ns),
            Some(newest) if start > newest => {
                let steps = (i128::from(start) - i128::from(newest)) / i128::from(self.width);
                if steps >= self.nb as i128 {
                    self.reset(start, ts_ns);
                } else {
                    let mut s = newest;
                    for _ in 0..steps {
                        s += self.width; // ≤ start, cannot overflow
                        self.clear(s);
                    }
                    self.newest = Some(start);
                    self.latest_ts = ts_ns;
                }
            }
            Some(newest) => {
                if start < newest {
                    if i128::from(self.latest_ts) - i128::from(ts_ns) < i128::from(self.width) {
                        start = newest;
                    } else if i128::from(start) <= i128::from(newest) - i128::from(self.span) {
                        return;
                    }
                }
                self.latest_ts = self.latest_ts.max(ts_ns);
            }
        }

        let slot = self.slot(start);
        if self.starts[slot] != start {
            // Only reachable if the ring invariant were broken; keep the data consistent anyway.
            self.clear(start);
        }
        self.samples[slot] += 1;
        let base = slot * self.fields;
        for (f, &v) in values.iter().enumerate() {
            if v.is_finite() {
                let i = base + f;
                self.count[i] += 1;
                self.sum[i] += v;
                self.min[i] = self.min[i].min(v);
                self.max[i] = self.max[i].max(v);
            }
        }
    }

    /// Summary over the buckets whose start is within `(now_ns − span, now_ns]`; None if no sample
    /// is in range. For `now_ns` before the newest bucket, only buckets still held in the ring
    /// (those after the newest bucket's start − span) can be included.
    pub fn summary(&self, now_ns: i64) -> Option<Summary> {
        let lo = i128::from(now_ns) - i128::from(self.span);
        let mut samples = 0u64;
        let mut oldest = i64::MAX;
        let mut count = vec![0u64; self.fields];
        let mut sum = vec![0.0; self.fields];
        let mut min = vec![f64::INFINITY; self.fields];
        let mut max = vec![f64::NEG_INFINITY; self.fields];
        for slot in 0..self.nb {
            let start = self.starts[slot];
            if self.samples[slot] == 0 || i128::from(start) <= lo || start > now_ns {
                continue;
            }
            samples += self.samples[slot];
            oldest = oldest.min(start);
            let base = slot * self.fields;
            for f in 0..self.fields {
                let i = base + f;
                count[f] += self.count[i];
                sum[f] += self.sum[i];
                min[f] = min[f].min(self.min[i]);
                max[f] = max[f].max(self.max[i]);
            }
        }
        if samples == 0 {
            return None;
        }
        let none_to_nan = |c: u64, v: f64| if c == 0 { f64::NAN } else { v };
        Some(Summary {
            mean: count
                .iter()
                .zip(&sum)
                .map(|(&c, &s)| none_to_nan(c, s / c as f64))
                .collect(),
            min: count.iter().zip(&min).map(|(&c, &m)| none_to_nan(c, m)).collect(),
            max: count.iter().zip(&max).map(|(&c, &m)| none_to_nan(c, m)).collect(),
            samples,
            // oldest > now − span, so this is in [0, span).
            covered_ns: now_ns.saturating_sub(oldest),
        })
    }

    /// Start of the bucket holding `ts`; None if it would be before `i64::MIN`.
    fn align(&self, ts: i64) -> Option<i64> {
        ts.div_euclid(self.width).checked_mul(self.width)
    }

    fn slot(&self, start: i64) -> usize {
        start.div_euclid(self.width).rem_euclid(self.nb as i64) as usize
    }

    /// Empties the slot of bucket `start` and makes it hold that bucket.
    fn clear(&mut self, start: i64) {
        let slot = self.slot(start);
        self.starts[slot] = start;
        self.samples[slot] = 0;
        let cells = slot * self.fields..(slot + 1) * self.fields;
        self.count[cells.clone()].fill(0);
        self.sum[cells.clone()].fill(0.0);
        self.min[cells.clone()].fill(f64::INFINITY);
        self.max[cells].fill(f64::NEG_INFINITY);
    }

    /// Forgets everything; `start` becomes the newest bucket.
    fn reset(&mut self, start: i64, ts: i64) {
        self.starts.fill(i64::MIN);
        self.samples.fill(0);
        self.count.fill(0);
        self.sum.fill(0.0);
        self.min.fill(f64::INFINITY);
        self.max.fill(f64::NEG_INFINITY);
        self.clear(start);
        self.newest = Some(start);
        self.latest_ts = ts;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one_minute(fields: usize) -> Rolling {
        Rolling::new(window("1m").unwrap(), fields)
    }

    #[test]
    fn standard_windows() {
        let w = window("1m").unwrap();
        assert_eq!((w.span_ns, w.buckets, w.bucket_ns()), (60 * SEC, 12, 5 * SEC));
        let w = window("10m").unwrap();
        assert_eq!((w.span_ns, w.buckets, w.bucket_ns()), (600 * SEC, 20, 30 * SEC));
        let w = window("60m").unwrap();
        assert_eq!((w.span_ns, w.buckets, w.bucket_ns()), (3600 * SEC, 30, 120 * SEC));
        assert!(window("5m").is_none());
        for w in WINDOWS {
            assert_eq!(w.bucket_ns() * w.buckets as i64, w.span_ns, "{}", w.name);
        }
    }

    #[test]
    fn aligned_data_is_exact() {
        let mut r = one_minute(2);
        assert!(r.summary(0).is_none());
        for k in 0..60 {
            let k = k as f64;
            r.add(k as i64 * SEC, &[k, -2.0 * k]);
        }
        let s = r.summary(59 * SEC).unwrap();
        assert_eq!(s.samples, 60);
        assert_eq!(s.mean, vec![29.5, -59.0]);
        assert_eq!(s.min, vec![0.0, -118.0]);
        assert_eq!(s.max, vec![59.0, 0.0]);
        assert_eq!(s.covered_ns, 59 * SEC);

        // At 60 s the bucket [0, 5 s) is no longer within (0, 60 s]: samples 5..=59 remain.
        let s = r.summary(60 * SEC).unwrap();
        assert_eq!(s.samples, 55);
        assert_eq!(s.mean, vec![32.0, -64.0]);
        assert_eq!(s.min, vec![5.0, -118.0]);
        assert_eq!(s.covered_ns, 55 * SEC);

        // A summary for an instant inside the data only sees buckets started by then.
        let s = r.summary(9 * SEC + 1).unwrap();
        assert_eq!(s.samples, 10);
        assert_eq!(s.max, vec![9.0, 0.0]);
    }

    #[test]
    fn old_buckets_slide_out() {
        let mut r = one_minute(1);
        for k in 0..120 {
            r.add(k * SEC, &[k as f64]);
        }
        let s = r.summary(119 * SEC).unwrap();
        assert_eq!(s.samples, 60);
        assert_eq!(s.mean, vec![89.5]);
        assert_eq!(s.min, vec![60.0]);
        assert_eq!((s.max[0], s.covered_ns), (119.0, 59 * SEC));
        // Without new data the window empties as time passes.
        let s = r.summary(150 * SEC).unwrap();
        assert_eq!((s.samples, s.min[0]), (25, 95.0));
        assert!(r.summary(180 * SEC).is_none());
        // The ring dropped the first minute for good.
        assert!(r.summary(30 * SEC).is_none());
    }

    #[test]
    fn nan_is_skipped_per_field() {
        let mut r = one_minute(2);
        r.add(SEC, &[f64::NAN, 1.0]);
        r.add(2 * SEC, &[f64::INFINITY, 3.0]);
        r.add(3 * SEC, &[f64::NAN, f64::NAN]); // nothing finite: not counted at all
        let s = r.summary(4 * SEC).unwrap();
        assert_eq!(s.samples, 2);
        assert!(s.mean[0].is_nan() && s.min[0].is_nan() && s.max[0].is_nan());
        assert_eq!((s.mean[1], s.min[1], s.max[1]), (2.0, 1.0, 3.0));
        r.add(4 * SEC, &[10.0, f64::NAN]);
        let s = r.summary(4 * SEC).unwrap();
        assert_eq!(s.samples, 3);
        assert_eq!(s.mean, vec![10.0, 2.0]);

        let mut r = one_minute(1);
        r.add(SEC, &[f64::NAN]);
        assert!(r.summary(SEC).is_none());
    }

    #[test]
    fn gap_longer_than_span_resets() {
        let mut r = one_minute(1);
        for k in 0..10 {
            r.add(k * SEC, &[100.0]);
        }
        r.add(100 * SEC, &[1.0]);
        let s = r.summary(100 * SEC).unwrap();
        assert_eq!((s.samples, s.mean[0], s.covered_ns), (1, 1.0, 0));
        assert!(r.summary(9 * SEC).is_none());
        // A gap of exactly one span also leaves nothing of the old data in the window.
        r.add(160 * SEC, &[2.0]);
        let s = r.summary(160 * SEC).unwrap();
        assert_eq!((s.samples, s.mean[0]), (1, 2.0));
        // A gap shorter than the span keeps what is still in range.
        r.add(200 * SEC, &[4.0]);
        let s = r.summary(200 * SEC).unwrap();
        assert_eq!((s.samples, s.mean[0], s.covered_ns), (2, 3.0, 40 * SEC));
    }

    #[test]
    fn out_of_order_samples() {
        let mut r = one_minute(1);
        r.add(12 * SEC, &[1.0]); // bucket [10, 15)
        r.add(9 * SEC + SEC / 2, &[2.0]); // 2.5 s back (< 5 s): into the current bucket
        r.add(3 * SEC, &[4.0]); // 9 s back: into its own bucket [0, 5)
        r.add(12 * SEC - 70 * SEC, &[1000.0]); // older than the ring: ignored
        r.add(-50 * SEC, &[1000.0]); // bucket −50 s = newest − span: slot reused, ignored
        r.add(-45 * SEC, &[8.0]); // bucket −45 s, still in the ring
        let s = r.summary(14 * SEC).unwrap();
        assert_eq!(s.samples, 4);
        assert_eq!((s.mean[0], s.min[0], s.max[0]), (15.0 / 4.0, 1.0, 8.0));
        assert_eq!(s.covered_ns, 59 * SEC);
        // The 9.5 s sample was counted in the 10 s bucket, so it is not seen at 9.9 s.
        let s = r.summary(9 * SEC + 9 * SEC / 10).unwrap();
        assert_eq!((s.samples, s.mean[0]), (2, 6.0));
        // Time going back to within a bucket of the latest sample, across a bucket boundary.
        r.add(15 * SEC, &[16.0]); // new bucket [15, 20)
        r.add(14 * SEC, &[32.0]); // 1 s back: current bucket [15, 20)
                                  // Advancing to [15, 20) reused the slot of [−45, −40) (15 s − span): the 8.0 is gone.
        let s = r.summary(14 * SEC).unwrap();
        assert_eq!((s.samples, s.max[0]), (3, 4.0));
        let s = r.summary(15 * SEC).unwrap();
        assert_eq!(s.max[0], 32.0);
    }

    #[test]
    fn wrong_length_values() {
        let mut r = one_minute(3);
        r.add(SEC, &[1.0]); // fields 1 and 2 missing: NaN
        r.add(2 * SEC, &[3.0, 5.0, 7.0, 9.0, 11.0]); // extra values ignored
        r.add(3 * SEC, &[]); // nothing: ignored
        let s = r.summary(3 * SEC).unwrap();
        assert_eq!(s.samples, 2);
        assert_eq!(s.mean, vec![2.0, 5.0, 7.0]);
        assert_eq!(s.max, vec![3.0, 5.0, 7.0]);

        let mut r = one_minute(0);
        r.add(SEC, &[1.0]);
        assert!(r.summary(SEC).is_none());
    }

    #[test]
    fn negative_and_extreme_timestamps() {
        let mut r = one_minute(1);
        r.add(-1, &[1.0]); // bucket [−5 s, 0)
        r.add(0, &[2.0]); // bucket [0, 5 s)
        let s = r.summary(-1).unwrap();
        assert_eq!((s.samples, s.covered_ns), (1, 5 * SEC - 1));
        assert_eq!(r.summary(0).unwrap().samples, 2);

        let mut r = one_minute(1);
        for ts in [
            i64::MIN,
            i64::MIN + 1,
            i64::MAX,
            i64::MIN,
            0,
            i64::MAX - 1,
            i64::MAX,
        ] {
            r.add(ts, &[1.0]);
            for now in [i64::MIN, 0, i64::MAX] {
                let _ = r.summary(now);
            }
        }
        assert_eq!(r.summary(i64::MAX).unwrap().samples, 3);
    }

    #[test]
    fn odd_windows_do_not_panic() {
        let odd = [
            Window {
                name: "z",
                span_ns: 0,
                buckets: 0,
            },
            Window {
                name: "n",
                span_ns: -5,
                buckets: 3,
            },
            Window {
                name: "u",
                span_ns: 10,
                buckets: 3,
            },
        ];
        for w in odd {
            let mut r = Rolling::new(w, 1);
            for ts in -20..20 {
                r.add(ts, &[ts as f64]);
            }
            let s = r.summary(19).unwrap();
            assert!(s.covered_ns >= 0 && s.covered_ns < w.bucket_ns() * w.buckets.max(1) as i64);
        }
    }

    #[test]
    fn long_run_matches_brute_force() {
        // Irregular timestamps (some backwards); compare with a direct computation over the samples
        // the ring must hold.
        let mut r = Rolling::new(window("10m").unwrap(), 1);
        let width = 30 * SEC;
        let mut seed = 0x1234_5678_9abc_def0_u64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let mut ts = 1_700_000_000 * SEC;
        let first = ts;
        let mut kept: Vec<(i64, f64)> = Vec::new(); // (bucket start used, value)
        let mut latest = i64::MIN;
        for i in 0..5000 {
            ts += (next() % (20 * SEC as u64)) as i64 - 2 * SEC;
            let v = (next() % 1000) as f64;
            r.add(ts, &[v]);
            // Every step goes back less than a bucket, so a backwards sample lands in the current one.
            let bucket = if ts < latest { latest } else { ts }.div_euclid(width) * width;
            latest = latest.max(ts);
            kept.push((bucket, v));
            if i % 97 == 0 {
                let now = latest + (next() % (40 * SEC as u64)) as i64;
                let inwin: Vec<f64> = kept
                    .iter()
                    .filter(|(b, _)| *b > now - 600 * SEC && *b <= now)
                    .map(|&(_, v)| v)
                    .collect();
                let s = r.summary(now);
                if inwin.is_empty() {
                    assert!(s.is_none());
                    continue;
                }
                let s = s.unwrap();
                assert_eq!(s.samples as usize, inwin.len());
                let mean = inwin.iter().sum::<f64>() / inwin.len() as f64;
                assert!((s.mean[0] - mean).abs() < 1e-9);
                assert_eq!(s.min[0], inwin.iter().copied().fold(f64::INFINITY, f64::min));
                assert_eq!(s.max[0], inwin.iter().copied().fold(f64::NEG_INFINITY, f64::max));
                assert!(s.covered_ns < 600 * SEC);
                if now - first > 700 * SEC {
                    // Every bucket has data, so the window edge is within one bucket of the span.
                    assert!(s.covered_ns >= 600 * SEC - width, "{}", s.covered_ns);
                }
            }
        }
    }
}
