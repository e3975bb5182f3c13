//! The evaluator: a parsed PromQL expression evaluated at every step of a query (an instant
//! query is a range of one step) over an [`Archive`], with Prometheus 2.x semantics:
//!
//! - an instant selector at time `t` takes each series' newest sample in `[t - 5m, t]`
//!   ([`LOOKBACK_MS`]); a range selector `[r]` the samples in `[t - r, t]` (both ends closed, as
//!   Prometheus 2.x);
//! - `rate` and `increase` extrapolate towards the window's ends like Prometheus'
//!   `extrapolatedRate` (at most half an average sample interval beyond the first and last
//!   sample when they are not within 1.1 intervals of the ends, never below zero for a
//!   counter), with counter resets (a drop adds the value before it);
//! - `*_over_time`, `quantile_over_time` (linear interpolation between closest ranks);
//! - `sum/avg/min/max/count [by|without (...)]`, `topk(k, ...)`;
//! - `+ - * / % ^` between scalars and between a vector and a scalar, and unary minus;
//! - functions and arithmetic drop `__name__`, aggregations keep the grouping labels only,
//!   `topk` keeps each series' labels.
//!
//! Anything else is [`Error::BadData`] naming the construct. Every sample loaded counts
//! against the query's sample limit, and the deadline is checked while loading and between
//! steps.

use std::collections::BTreeMap;
use std::time::Instant;

use promql_parser::label::{MatchOp, Matcher, METRIC_NAME};
use promql_parser::parser::{AggregateExpr, Call, Expr, LabelModifier, MatrixSelector, VectorSelector};

use super::Error;

/// The lookback of instant selectors (Prometheus' default `--query.lookback-delta`).
pub const LOOKBACK_MS: i64 = 5 * 60 * 1000;
/// Most steps of a range query (Prometheus' limit: 11,000 points per series).
pub const MAX_STEPS: i64 = 11_000;

/// Prometheus' refusal of a range selector at the top of a range query.
pub const RANGE_VECTOR_IN_RANGE_QUERY: &str =
    "invalid expression type \"range vector\" for range query, must be Scalar or instant Vector";

/// A series' labels, sorted by name.
pub type Labels = Vec<(String, String)>;

/// One numeric series the archive holds, with its Prometheus labels ([`crate::promlabels`]).
#[derive(Debug, Clone, PartialEq)]
pub struct SeriesRef {
    pub event: String,
    pub source: String,
    pub field: String,
    pub labels: Labels,
}

/// What the evaluator reads: the series a reader may see, and their samples.
pub trait Archive {
    /// The numeric series matching every matcher (a label that is absent matches as `""`)
    /// that the reader may read.
    fn select(&self, matchers: &[LabelMatcher]) -> Result<Vec<SeriesRef>, Error>;
    /// Feeds the samples of `s` with `from_ms <= t <= to_ms` to `out` in time order (`out`
    /// returns false to stop).
    fn samples(
        &self,
        s: &SeriesRef,
        from_ms: i64,
        to_ms: i64,
        out: &mut dyn FnMut(i64, f64) -> bool,
    ) -> Result<(), Error>;
}

/// A label matcher (`=`, `!=`, `=~`, `!~`; regular expressions anchored at both ends).
#[derive(Debug, Clone)]
pub struct LabelMatcher {
    pub name: String,
    op: Op,
}

#[derive(Debug, Clone)]
enum Op {
    Eq(String),
    Ne(String),
    Re(regex::Regex),
    NotRe(regex::Regex),
}

impl LabelMatcher {
    /// `name = value`.
    pub fn equal(name: &str, value: &str) -> LabelMatcher {
        LabelMatcher {
            name: name.to_string(),
            op: Op::Eq(value.to_string()),
        }
    }

    fn of(m: &Matcher) -> Result<LabelMatcher, Error> {
        let re = |v: &str| {
            regex::Regex::new(&format!("^(?:{v})$"))
                .map_err(|e| Error::BadData(format!("invalid regular expression {v:?}: {e}")))
        };
        let op = match &m.op {
            MatchOp::Equal => Op::Eq(m.value.clone()),
            MatchOp::NotEqual => Op::Ne(m.value.clone()),
            MatchOp::Re(_) => Op::Re(re(&m.value)?),
            MatchOp::NotRe(_) => Op::NotRe(re(&m.value)?),
        };
        Ok(LabelMatcher {
            name: m.name.clone(),
            op,
        })
    }

    /// True when the value `v` of the label (`""` when absent) matches.
    pub fn matches(&self, v: &str) -> bool {
        match &self.op {
            Op::Eq(x) => x == v,
            Op::Ne(x) => x != v,
            Op::Re(r) => r.is_match(v),
            Op::NotRe(r) => !r.is_match(v),
        }
    }

    /// The value this matcher requires exactly, if it is an `=`.
    pub fn exact(&self) -> Option<&str> {
        match &self.op {
            Op::Eq(x) => Some(x),
            _ => None,
        }
    }
}

/// True when `labels` satisfy every matcher.
pub fn matches_all(labels: &Labels, matchers: &[LabelMatcher]) -> bool {
    matchers.iter().all(|m| {
        let v = labels
            .iter()
            .find(|(k, _)| *k == m.name)
            .map(|(_, v)| v.as_str())
            .unwrap_or("");
        m.matches(v)
    })
}

/// The matchers of a vector selector, its metric name included.
pub fn selector_matchers(vs: &VectorSelector) -> Result<Vec<LabelMatcher>, Error> {
    if vs.offset.is_some() {
        return Err(unsupported("the offset modifier"));
    }
    if vs.at.is_some() {
        return Err(unsupported("the @ modifier"));
    }
    if !vs.matchers.or_matchers.is_empty() {
        return Err(unsupported("\"or\" between label matchers"));
    }
    let mut out = Vec::new();
    if let Some(n) = &vs.name {
        out.push(LabelMatcher::equal(METRIC_NAME, n));
    }
    for m in &vs.matchers.matchers {
        out.push(LabelMatcher::of(m)?);
    }
    Ok(out)
}

fn unsupported(what: &str) -> Error {
    Error::BadData(format!(
        "unsupported by the gma archiver: {what} (supported: selectors with =, !=, =~, !~, range \
         vectors, rate, increase, avg/min/max/sum/count/quantile_over_time, sum/avg/min/max/count \
         by|without, topk, arithmetic with scalars; see docs/promql.md)"
    ))
}

/// The steps of a query: `start, start + step, ..., <= end` (ms).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Steps {
    pub start: i64,
    pub end: i64,
    pub step: i64,
}

impl Steps {
    /// One step at `t` (an instant query).
    pub fn instant(t: i64) -> Steps {
        Steps {
            start: t,
            end: t,
            step: 1,
        }
    }

    /// A range query's steps, checked like Prometheus checks them.
    pub fn range(start: i64, end: i64, step: i64) -> Result<Steps, Error> {
        if end < start {
            return Err(Error::BadData(
                "end timestamp must not be before start time".into(),
            ));
        }
        if step <= 0 {
            return Err(Error::BadData(
                "zero or negative query resolution step widths are not accepted. Try a positive integer"
                    .into(),
            ));
        }
        if (end - start) / step >= MAX_STEPS {
            return Err(Error::BadData(format!(
                "exceeded maximum resolution of {MAX_STEPS} points per timeseries. Try decreasing \
                 the query resolution (?step=XX)"
            )));
        }
        Ok(Steps { start, end, step })
    }

    pub fn len(&self) -> usize {
        ((self.end - self.start) / self.step + 1) as usize
    }

    pub fn is_empty(&self) -> bool {
        false
    }

    pub fn at(&self, i: usize) -> i64 {
        self.start + i as i64 * self.step
    }
}

/// A series of a vector result: its labels and its value at each step (`None`: absent).
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub labels: Labels,
    pub values: Vec<Option<f64>>,
}

/// A raw series of a range selector evaluated at one instant (an instant query of `x[5m]`).
#[derive(Debug, Clone, PartialEq)]
pub struct RawSeries {
    pub labels: Labels,
    pub samples: Vec<(i64, f64)>,
}

/// What an expression evaluates to.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// One value per step.
    Scalar(Vec<f64>),
    Vector(Vec<Row>),
    /// Only at the top of an instant query.
    Matrix(Vec<RawSeries>),
}

/// Limits of one evaluation.
pub struct Budget {
    pub max_samples: usize,
    pub deadline: Instant,
    pub timeout: std::time::Duration,
    loaded: usize,
}

impl Budget {
    pub fn new(max_samples: usize, timeout: std::time::Duration) -> Budget {
        Budget {
            max_samples,
            deadline: Instant::now() + timeout,
            timeout,
            loaded: 0,
        }
    }

    /// Samples loaded so far.
    pub fn loaded(&self) -> usize {
        self.loaded
    }

    fn check_time(&self) -> Result<(), Error> {
        if Instant::now() > self.deadline {
            return Err(Error::Timeout(self.timeout));
        }
        Ok(())
    }
}

/// Evaluates `expr` at every step of `steps`.
pub fn evaluate(
    archive: &dyn Archive,
    expr: &Expr,
    steps: Steps,
    budget: &mut Budget,
) -> Result<Value, Error> {
    let mut ev = Eval {
        archive,
        steps,
        budget,
    };
    match expr {
        Expr::MatrixSelector(ms) => {
            if steps.len() != 1 {
                return Err(Error::BadData(RANGE_VECTOR_IN_RANGE_QUERY.into()));
            }
            let range = duration_ms(&ms.range);
            let t = steps.start;
            let series = ev.load(&ms.vs, t - range, t)?;
            Ok(Value::Matrix(
                series.into_iter().filter(|s| !s.samples.is_empty()).collect(),
            ))
        }
        e => ev.eval(e),
    }
}

fn duration_ms(d: &std::time::Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX / 4)
}

struct Eval<'a> {
    archive: &'a dyn Archive,
    steps: Steps,
    budget: &'a mut Budget,
}

impl Eval<'_> {
    fn eval(&mut self, e: &Expr) -> Result<Value, Error> {
        self.budget.check_time()?;
        match e {
            Expr::NumberLiteral(n) => Ok(Value::Scalar(vec![n.val; self.steps.len()])),
            Expr::Paren(p) => self.eval(&p.expr),
            Expr::Unary(u) => {
                let v = self.eval(&u.expr)?;
                Ok(map_values(v, |x| -x))
            }
            Expr::Binary(b) => {
                let op = b.op.to_string();
                let f = arith(&op).ok_or_else(|| unsupported(&format!("the binary operator {op:?}")))?;
                let (l, r) = (self.eval(&b.lhs)?, self.eval(&b.rhs)?);
                match (l, r) {
                    (Value::Scalar(a), Value::Scalar(c)) => {
                        Ok(Value::Scalar(a.iter().zip(&c).map(|(x, y)| f(*x, *y)).collect()))
                    }
                    (Value::Vector(rows), Value::Scalar(c)) => Ok(Value::Vector(
                        rows.into_iter().map(|r| with_scalar(r, &c, f)).collect(),
                    )),
                    (Value::Scalar(c), Value::Vector(rows)) => Ok(Value::Vector(
                        rows.into_iter()
                            .map(|r| with_scalar(r, &c, |x, y| f(y, x)))
                            .collect(),
                    )),
                    _ => Err(unsupported("binary operations between two instant vectors")),
                }
            }
            Expr::VectorSelector(vs) => self.instant(vs),
            Expr::MatrixSelector(_) => Err(Error::BadData(
                "a range vector is allowed only as the argument of a function (rate, increase, *_over_time)"
                    .into(),
            )),
            Expr::Call(c) => self.call(c),
            Expr::Aggregate(a) => self.aggregate(a),
            Expr::Subquery(_) => Err(unsupported("subqueries")),
            Expr::StringLiteral(_) => Err(unsupported("string literals")),
            Expr::Extension(_) => Err(unsupported("extension expressions")),
        }
    }

    /// The samples of every series `vs` selects in `[from, to]`.
    fn load(&mut self, vs: &VectorSelector, from: i64, to: i64) -> Result<Vec<RawSeries>, Error> {
        let matchers = selector_matchers(vs)?;
        let series = self.archive.select(&matchers)?;
        let mut out = Vec::with_capacity(series.len());
        for s in series {
            let mut samples = Vec::new();
            let mut over = false;
            let mut late = false;
            let budget = &mut *self.budget;
            self.archive.samples(&s, from, to, &mut |t, v| {
                budget.loaded += 1;
                if budget.loaded > budget.max_samples {
                    over = true;
                    return false;
                }
                if budget.loaded.is_multiple_of(4096) && Instant::now() > budget.deadline {
                    late = true;
                    return false;
                }
                samples.push((t, v));
                true
            })?;
            if over {
                return Err(Error::TooManySamples(self.budget.max_samples));
            }
            if late {
                return Err(Error::Timeout(self.budget.timeout));
            }
            out.push(RawSeries {
                labels: s.labels,
                samples,
            });
        }
        Ok(out)
    }

    fn instant(&mut self, vs: &VectorSelector) -> Result<Value, Error> {
        let st = self.steps;
        let series = self.load(vs, st.start - LOOKBACK_MS, st.end)?;
        let mut rows = Vec::new();
        for s in series {
            let mut values = Vec::with_capacity(st.len());
            let mut i = 0; // first sample after the step
            for k in 0..st.len() {
                let t = st.at(k);
                while i < s.samples.len() && s.samples[i].0 <= t {
                    i += 1;
                }
                values.push(match i.checked_sub(1).map(|j| s.samples[j]) {
                    Some((ts, v)) if ts >= t - LOOKBACK_MS => Some(v),
                    _ => None,
                });
            }
            if values.iter().any(Option::is_some) {
                rows.push(Row {
                    labels: s.labels,
                    values,
                });
            }
        }
        Ok(Value::Vector(rows))
    }

    /// Applies `f` to the window `[t - range, t]` of every series at every step.
    fn windows(
        &mut self,
        ms: &MatrixSelector,
        mut f: impl FnMut(&[(i64, f64)], i64, i64, usize) -> Option<f64>,
    ) -> Result<Vec<Row>, Error> {
        let st = self.steps;
        let range = duration_ms(&ms.range);
        let series = self.load(&ms.vs, st.start - range, st.end)?;
        let mut rows = Vec::new();
        for s in series {
            self.budget.check_time()?;
            let (mut lo, mut hi) = (0, 0);
            let mut values = Vec::with_capacity(st.len());
            for k in 0..st.len() {
                let t = st.at(k);
                while hi < s.samples.len() && s.samples[hi].0 <= t {
                    hi += 1;
                }
                while lo < hi && s.samples[lo].0 < t - range {
                    lo += 1;
                }
                let w = &s.samples[lo..hi];
                values.push(if w.is_empty() { None } else { f(w, t - range, t, k) });
            }
            if values.iter().any(Option::is_some) {
                rows.push(Row {
                    labels: drop_name(s.labels),
                    values,
                });
            }
        }
        Ok(rows)
    }

    fn call(&mut self, c: &Call) -> Result<Value, Error> {
        let name = c.func.name;
        let args = &c.args.args;
        let matrix = |i: usize| -> Result<&MatrixSelector, Error> {
            match args.get(i).map(|a| &**a) {
                Some(Expr::MatrixSelector(ms)) => Ok(ms),
                Some(Expr::Subquery(_)) => Err(unsupported("subqueries")),
                _ => Err(Error::BadData(format!(
                    "{name}: expected a range vector argument"
                ))),
            }
        };
        let rows = match name {
            "rate" | "increase" => {
                let ms = matrix(0)?;
                let is_rate = name == "rate";
                let range_s = ms.range.as_secs_f64();
                self.windows(ms, |w, start, end, _| {
                    extrapolated_rate(w, start, end, true, is_rate.then_some(range_s))
                })?
            }
            "avg_over_time" | "min_over_time" | "max_over_time" | "sum_over_time" | "count_over_time" => {
                let ms = matrix(0)?;
                let agg: fn(&[(i64, f64)]) -> f64 = match name {
                    "avg_over_time" => |w| w.iter().map(|s| s.1).sum::<f64>() / w.len() as f64,
                    "min_over_time" => |w| w.iter().map(|s| s.1).fold(f64::NAN, nan_min),
                    "max_over_time" => |w| w.iter().map(|s| s.1).fold(f64::NAN, nan_max),
                    "sum_over_time" => |w| w.iter().map(|s| s.1).sum(),
                    _ => |w| w.len() as f64,
                };
                self.windows(ms, |w, _, _, _| Some(agg(w)))?
            }
            "quantile_over_time" => {
                let q = match args.first() {
                    Some(a) => match self.eval(a)? {
                        Value::Scalar(q) => q,
                        _ => return Err(Error::BadData("quantile_over_time: φ must be a scalar".into())),
                    },
                    None => return Err(Error::BadData("quantile_over_time: φ is missing".into())),
                };
                let ms = matrix(1)?;
                self.windows(ms, |w, _, _, k| {
                    let mut v: Vec<f64> = w.iter().map(|s| s.1).collect();
                    Some(quantile(q[k], &mut v))
                })?
            }
            other => return Err(unsupported(&format!("the function {other}()"))),
        };
        Ok(Value::Vector(rows))
    }

    fn aggregate(&mut self, a: &AggregateExpr) -> Result<Value, Error> {
        let op = a.op.to_string();
        let n = self.steps.len();
        let k = match (&*op, &a.param) {
            ("topk", Some(p)) => match self.eval(p)? {
                Value::Scalar(k) => Some(k),
                _ => return Err(Error::BadData("topk: k must be a scalar".into())),
            },
            ("topk", None) => return Err(Error::BadData("topk: k is missing".into())),
            ("sum" | "avg" | "min" | "max" | "count", _) => None,
            (other, _) => return Err(unsupported(&format!("the aggregation {other}"))),
        };
        let rows = match self.eval(&a.expr)? {
            Value::Vector(rows) => rows,
            _ => return Err(Error::BadData(format!("{op}: expected an instant vector"))),
        };
        let key = |l: &Labels| -> Labels {
            match &a.modifier {
                None => Vec::new(),
                Some(LabelModifier::Include(ls)) => l
                    .iter()
                    .filter(|(n, _)| ls.labels.contains(n) && *n != METRIC_NAME)
                    .cloned()
                    .collect(),
                Some(LabelModifier::Exclude(ls)) => l
                    .iter()
                    .filter(|(n, _)| !ls.labels.contains(n) && *n != METRIC_NAME)
                    .cloned()
                    .collect(),
            }
        };
        let mut groups: BTreeMap<Labels, Vec<usize>> = BTreeMap::new();
        for (i, r) in rows.iter().enumerate() {
            groups.entry(key(&r.labels)).or_default().push(i);
        }
        if let Some(k) = k {
            let mut keep = vec![vec![None; n]; rows.len()];
            for members in groups.values() {
                for (step, kk) in k.iter().enumerate() {
                    let take = if kk.is_nan() || *kk < 1.0 {
                        0
                    } else {
                        kk.min(members.len() as f64) as usize
                    };
                    let mut present: Vec<(usize, f64)> = members
                        .iter()
                        .filter_map(|&i| rows[i].values[step].map(|v| (i, v)))
                        .collect();
                    // Largest first; NaN last.
                    present.sort_by(|x, y| match (x.1.is_nan(), y.1.is_nan()) {
                        (true, true) => std::cmp::Ordering::Equal,
                        (true, false) => std::cmp::Ordering::Greater,
                        (false, true) => std::cmp::Ordering::Less,
                        _ => y.1.total_cmp(&x.1),
                    });
                    for (i, v) in present.into_iter().take(take) {
                        keep[i][step] = Some(v);
                    }
                }
            }
            return Ok(Value::Vector(
                rows.into_iter()
                    .zip(keep)
                    .filter(|(_, v)| v.iter().any(Option::is_some))
                    .map(|(r, values)| Row {
                        labels: r.labels,
                        values,
                    })
                    .collect(),
            ));
        }
        let mut out = Vec::with_capacity(groups.len());
        for (labels, members) in groups {
            let values = (0..n)
                .map(|step| {
                    let vals = members.iter().filter_map(|&i| rows[i].values[step]);
                    aggregate_values(&op, vals)
                })
                .collect::<Vec<_>>();
            if values.iter().any(Option::is_some) {
                out.push(Row { labels, values });
            }
        }
        Ok(Value::Vector(out))
    }
}

/// sum/avg/min/max/count of the values present at one step (`None` when there is none).
fn aggregate_values(op: &str, vals: impl Iterator<Item = f64>) -> Option<f64> {
    let (mut count, mut sum, mut min, mut max) = (0usize, 0.0, f64::NAN, f64::NAN);
    for v in vals {
        count += 1;
        sum += v;
        min = nan_min(min, v);
        max = nan_max(max, v);
    }
    if count == 0 {
        return None;
    }
    Some(match op {
        "sum" => sum,
        "avg" => sum / count as f64,
        "min" => min,
        "max" => max,
        _ => count as f64,
    })
}

/// The smaller of two values, a NaN giving way to a number (as Prometheus' min).
fn nan_min(acc: f64, v: f64) -> f64 {
    if acc.is_nan() || v < acc {
        v
    } else {
        acc
    }
}

fn nan_max(acc: f64, v: f64) -> f64 {
    if acc.is_nan() || v > acc {
        v
    } else {
        acc
    }
}

fn arith(op: &str) -> Option<fn(f64, f64) -> f64> {
    Some(match op {
        "+" => |a, b| a + b,
        "-" => |a, b| a - b,
        "*" => |a, b| a * b,
        "/" => |a, b| a / b,
        // Go's math.Mod: the sign of the dividend, like Rust's %.
        "%" => |a, b| a % b,
        "^" => f64::powf,
        _ => return None,
    })
}

fn with_scalar(r: Row, c: &[f64], f: impl Fn(f64, f64) -> f64) -> Row {
    Row {
        labels: drop_name(r.labels),
        values: r.values.iter().zip(c).map(|(v, s)| v.map(|v| f(v, *s))).collect(),
    }
}

fn map_values(v: Value, f: impl Fn(f64) -> f64) -> Value {
    match v {
        Value::Scalar(s) => Value::Scalar(s.into_iter().map(f).collect()),
        Value::Vector(rows) => Value::Vector(
            rows.into_iter()
                .map(|r| Row {
                    labels: drop_name(r.labels),
                    values: r.values.into_iter().map(|v| v.map(&f)).collect(),
                })
                .collect(),
        ),
        Value::Matrix(m) => Value::Matrix(m),
    }
}

fn drop_name(mut l: Labels) -> Labels {
    l.retain(|(n, _)| n != METRIC_NAME);
    l
}

/// Prometheus' `rate`/`increase` of the samples `w` of the window `[start, end]` (ms):
/// `None` with fewer than two samples. `per_second`: the range in seconds (rate), or `None`
/// (increase).
pub fn extrapolated_rate(
    w: &[(i64, f64)],
    start: i64,
    end: i64,
    is_counter: bool,
    per_second: Option<f64>,
) -> Option<f64> {
    let (first, last) = (w.first()?, w.last()?);
    if w.len() < 2 {
        return None;
    }
    let mut result = last.1 - first.1;
    if is_counter {
        let mut prev = first.1;
        for s in &w[1..] {
            if s.1 < prev {
                result += prev;
            }
            prev = s.1;
        }
    }
    let sampled = (last.0 - first.0) as f64 / 1000.0;
    let mut to_start = (first.0 - start) as f64 / 1000.0;
    let to_end = (end - last.0) as f64 / 1000.0;
    let average = sampled / (w.len() - 1) as f64;
    if is_counter && result > 0.0 && first.1 >= 0.0 {
        // A counter does not go below zero: extrapolate at most to where it would be zero.
        let to_zero = sampled * (first.1 / result);
        if to_zero < to_start {
            to_start = to_zero;
        }
    }
    let threshold = average * 1.1;
    let mut interval = sampled;
    interval += if to_start < threshold {
        to_start
    } else {
        average / 2.0
    };
    interval += if to_end < threshold { to_end } else { average / 2.0 };
    let mut v = result * (interval / sampled);
    if let Some(range) = per_second {
        v /= range;
    }
    Some(v)
}

/// The φ-quantile of `v` (sorted here), interpolating linearly between the closest ranks, as
/// Prometheus' `quantile_over_time`: φ < 0 is -Inf, φ > 1 +Inf, NaN NaN.
pub fn quantile(q: f64, v: &mut [f64]) -> f64 {
    if v.is_empty() || q.is_nan() {
        return f64::NAN;
    }
    if q < 0.0 {
        return f64::NEG_INFINITY;
    }
    if q > 1.0 {
        return f64::INFINITY;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len() as f64;
    let rank = q * (n - 1.0);
    let lower = rank.floor().max(0.0);
    let upper = (lower + 1.0).min(n - 1.0);
    let weight = rank - lower;
    v[lower as usize] * (1.0 - weight) + v[upper as usize] * weight
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// An archive in memory: (labels, samples) per series.
    struct Mem(Vec<(Labels, Vec<(i64, f64)>)>);

    fn labels(name: &str, source: &str) -> Labels {
        vec![
            (METRIC_NAME.to_string(), name.to_string()),
            ("source".to_string(), source.to_string()),
        ]
    }

    impl Archive for Mem {
        fn select(&self, m: &[LabelMatcher]) -> Result<Vec<SeriesRef>, Error> {
            Ok(self
                .0
                .iter()
                .filter(|(l, _)| matches_all(l, m))
                .map(|(l, _)| SeriesRef {
                    event: String::new(),
                    source: String::new(),
                    field: String::new(),
                    labels: l.clone(),
                })
                .collect())
        }

        fn samples(
            &self,
            s: &SeriesRef,
            from: i64,
            to: i64,
            out: &mut dyn FnMut(i64, f64) -> bool,
        ) -> Result<(), Error> {
            for (l, ss) in &self.0 {
                if *l == s.labels {
                    for &(t, v) in ss {
                        if t >= from && t <= to && !out(t, v) {
                            return Ok(());
                        }
                    }
                }
            }
            Ok(())
        }
    }

    fn run(a: &Mem, q: &str, steps: Steps) -> Result<Value, Error> {
        let e = promql_parser::parser::parse(q).map_err(Error::BadData)?;
        evaluate(a, &e, steps, &mut Budget::new(1000, Duration::from_secs(10)))
    }

    /// The value of the only row (or scalar) at each step.
    fn one(v: Value) -> Vec<Option<f64>> {
        match v {
            Value::Vector(r) => {
                assert_eq!(r.len(), 1, "{r:?}");
                r[0].values.clone()
            }
            Value::Scalar(s) => s.into_iter().map(Some).collect(),
            Value::Matrix(m) => panic!("matrix {m:?}"),
        }
    }

    /// A counter sampled every 10 s from t = 0: 0, 10, 20, 30, 5 (reset), 15.
    fn counter() -> Mem {
        Mem(vec![(
            labels("c", "a"),
            vec![
                (0, 0.0),
                (10_000, 10.0),
                (20_000, 20.0),
                (30_000, 30.0),
                (40_000, 5.0),
                (50_000, 15.0),
            ],
        )])
    }

    #[test]
    fn instant_selector_takes_the_newest_sample_within_five_minutes() {
        let a = counter();
        let v = run(&a, "c", Steps::instant(25_000)).unwrap();
        assert_eq!(one(v), vec![Some(20.0)]);
        // Exactly 5 min after the last sample: still there; 1 ms later: gone.
        let v = run(&a, "c", Steps::instant(50_000 + LOOKBACK_MS)).unwrap();
        assert_eq!(one(v), vec![Some(15.0)]);
        let v = run(&a, "c", Steps::instant(50_001 + LOOKBACK_MS)).unwrap();
        assert_eq!(v, Value::Vector(vec![]));
        // Steps of a range.
        let v = run(&a, "c", Steps::range(0, 20_000, 5_000).unwrap()).unwrap();
        assert_eq!(
            one(v),
            vec![Some(0.0), Some(0.0), Some(10.0), Some(10.0), Some(20.0)]
        );
    }

    #[test]
    fn label_matchers_select_like_prometheus() {
        let a = Mem(vec![
            (labels("m", "hostA"), vec![(0, 1.0)]),
            (labels("m", "hostB"), vec![(0, 2.0)]),
            (labels("n", "hostA"), vec![(0, 3.0)]),
        ]);
        let count = |q: &str| match run(&a, q, Steps::instant(0)).unwrap() {
            Value::Vector(r) => r.len(),
            v => panic!("{v:?}"),
        };
        assert_eq!(count("m"), 2);
        assert_eq!(count(r#"m{source="hostA"}"#), 1);
        assert_eq!(count(r#"m{source!="hostA"}"#), 1);
        assert_eq!(count(r#"{source=~"host.*"}"#), 3);
        // Anchored: "host" alone does not match "hostA"; alternatives stay anchored.
        assert_eq!(count(r#"{source=~"host"}"#), 0);
        assert_eq!(count(r#"{source=~"hostA|x"}"#), 2);
        assert_eq!(count(r#"m{source!~"hostA|hostB"}"#), 0);
        // An absent label matches as "".
        assert_eq!(count(r#"m{job=""}"#), 2);
    }

    #[test]
    fn rate_and_increase_extrapolate_and_handle_resets_like_prometheus() {
        let a = counter();
        // Window [0, 60 s] at t = 60 s: samples 0..50 s, increase 30 + 15 (reset) = 45.
        // sampled 50 s, average 10 s; to start 0 s (< 11) but to zero = 50*0/45 = 0; to end
        // 10 s (< 11): interval 60 s: 45 * 60/50 = 54.
        let v = run(&a, "increase(c[1m])", Steps::instant(60_000)).unwrap();
        assert_eq!(one(v), vec![Some(54.0)]);
        let v = run(&a, "rate(c[1m])", Steps::instant(60_000)).unwrap();
        assert_eq!(one(v), vec![Some(54.0 / 60.0)]);
        // Window [35 s, 55 s]: samples 40 s (5) and 50 s (15): increase 10, sampled 10 s,
        // average 10 s; to start 5 s, to zero 10*5/10 = 5 s; to end 5 s: 10 * 20/10 = 20.
        let v = run(&a, "increase(c[20s])", Steps::instant(55_000)).unwrap();
        assert_eq!(one(v), vec![Some(20.0)]);
        // Far ends extrapolate half an interval: window [0, 200 s] with samples 100..120 s of
        // a counter at 1000, 1010, 1020: increase 20 over 20 s; to start 100 s (> 11) → +5 s;
        // to end 80 s → +5 s: 20 * 30/20 = 30.
        let b = Mem(vec![(
            labels("d", "a"),
            vec![(100_000, 1000.0), (110_000, 1010.0), (120_000, 1020.0)],
        )]);
        let v = run(&b, "increase(d[200s])", Steps::instant(200_000)).unwrap();
        assert_eq!(one(v), vec![Some(30.0)]);
        // One sample: no result.
        let v = run(&b, "rate(d[5s])", Steps::instant(120_000)).unwrap();
        assert_eq!(v, Value::Vector(vec![]));
        // The function drops the metric name.
        let Value::Vector(r) = run(&a, "rate(c[1m])", Steps::instant(60_000)).unwrap() else {
            panic!()
        };
        assert_eq!(r[0].labels, vec![("source".to_string(), "a".to_string())]);
    }

    #[test]
    fn over_time_functions_compute_on_the_closed_window() {
        let a = counter();
        // [20 s, 40 s]: 20, 30, 5.
        let at = Steps::instant(40_000);
        let cases = [
            ("avg_over_time(c[20s])", 55.0 / 3.0),
            ("min_over_time(c[20s])", 5.0),
            ("max_over_time(c[20s])", 30.0),
            ("sum_over_time(c[20s])", 55.0),
            ("count_over_time(c[20s])", 3.0),
            // sorted 5, 20, 30: rank 0.5*2 = 1 → 20; 0.75 → rank 1.5 → 25.
            ("quantile_over_time(0.5, c[20s])", 20.0),
            ("quantile_over_time(0.75, c[20s])", 25.0),
            ("quantile_over_time(1, c[20s])", 30.0),
            ("quantile_over_time(-1, c[20s])", f64::NEG_INFINITY),
        ];
        for (q, want) in cases {
            assert_eq!(one(run(&a, q, at).unwrap()), vec![Some(want)], "{q}");
        }
    }

    #[test]
    fn aggregations_group_by_and_without() {
        let mut l1 = labels("m", "a");
        l1.push(("zone".into(), "x".into()));
        let mut l2 = labels("m", "b");
        l2.push(("zone".into(), "x".into()));
        let mut l3 = labels("m", "c");
        l3.push(("zone".into(), "y".into()));
        let a = Mem(vec![
            (l1, vec![(0, 1.0)]),
            (l2, vec![(0, 3.0)]),
            (l3, vec![(0, 10.0)]),
        ]);
        let at = Steps::instant(0);
        for (q, want) in [
            ("sum(m)", 14.0),
            ("avg(m)", 14.0 / 3.0),
            ("min(m)", 1.0),
            ("max(m)", 10.0),
            ("count(m)", 3.0),
        ] {
            assert_eq!(one(run(&a, q, at).unwrap()), vec![Some(want)], "{q}");
        }
        let Value::Vector(r) = run(&a, "sum by (zone) (m)", at).unwrap() else {
            panic!()
        };
        let got: Vec<_> = r.iter().map(|r| (r.labels.clone(), r.values[0])).collect();
        assert_eq!(
            got,
            vec![
                (vec![("zone".to_string(), "x".to_string())], Some(4.0)),
                (vec![("zone".to_string(), "y".to_string())], Some(10.0)),
            ]
        );
        let Value::Vector(r) = run(&a, "max without (source) (m)", at).unwrap() else {
            panic!()
        };
        assert_eq!(r.len(), 2);
        assert_eq!(r[0].labels, vec![("zone".to_string(), "x".to_string())]);
        assert_eq!(r[0].values, vec![Some(3.0)]);
        // topk keeps the series' own labels.
        let Value::Vector(r) = run(&a, "topk(2, m)", at).unwrap() else {
            panic!()
        };
        let mut got: Vec<_> = r.iter().map(|r| (r.labels[1].1.clone(), r.values[0])).collect();
        got.sort_by(|x, y| x.0.cmp(&y.0));
        assert_eq!(
            got,
            vec![("b".to_string(), Some(3.0)), ("c".to_string(), Some(10.0))]
        );
        assert_eq!(r[0].labels[0].0, METRIC_NAME);
        let Value::Vector(r) = run(&a, "topk by (zone) (1, m)", at).unwrap() else {
            panic!()
        };
        assert_eq!(r.len(), 2);
    }

    #[test]
    fn arithmetic_with_scalars() {
        let a = counter();
        let at = Steps::instant(10_000);
        for (q, want) in [
            ("c * 2", 20.0),
            ("2 * c", 20.0),
            ("c / 4", 2.5),
            ("100 - c", 90.0),
            ("c % 3", 1.0),
            ("c ^ 2", 100.0),
            ("-c", -10.0),
            ("(c + 1) * 2", 22.0),
            ("1 + 2 * 3", 7.0),
        ] {
            assert_eq!(one(run(&a, q, at).unwrap()), vec![Some(want)], "{q}");
        }
    }

    #[test]
    fn unsupported_constructs_are_bad_data_naming_them() {
        let a = counter();
        let at = Steps::instant(10_000);
        for (q, what) in [
            ("irate(c[1m])", "the function irate()"),
            ("c + c", "binary operations between two instant vectors"),
            ("c > 1", "the binary operator \">\""),
            ("stddev(c)", "the aggregation stddev"),
            ("c offset 1m", "the offset modifier"),
            ("max_over_time(c[1m:10s])", "subqueries"),
        ] {
            match run(&a, q, at) {
                Err(Error::BadData(m)) => assert!(m.contains(what), "{q}: {m}"),
                other => panic!("{q}: {other:?}"),
            }
        }
        assert!(matches!(
            run(&a, "c[1m]", Steps::range(0, 10_000, 1_000).unwrap()),
            Err(Error::BadData(_))
        ));
        // A range selector at the top of an instant query is a matrix of raw samples.
        let Value::Matrix(m) = run(&a, "c[15s]", at).unwrap() else {
            panic!()
        };
        assert_eq!(m[0].samples, vec![(0, 0.0), (10_000, 10.0)]);
    }

    #[test]
    fn the_sample_limit_and_the_steps_are_enforced() {
        let a = counter();
        let e = promql_parser::parser::parse("c").unwrap();
        let mut b = Budget::new(3, Duration::from_secs(10));
        assert_eq!(
            evaluate(&a, &e, Steps::instant(60_000), &mut b),
            Err(Error::TooManySamples(3))
        );
        let mut b = Budget::new(6, Duration::from_secs(10));
        assert!(evaluate(&a, &e, Steps::instant(60_000), &mut b).is_ok());
        assert_eq!(b.loaded(), 6);
        assert!(Steps::range(0, 11_000_000, 1_000).is_err());
        assert!(Steps::range(0, 10_999_000, 1_000).is_ok());
        assert!(Steps::range(10, 0, 1).is_err());
        assert!(Steps::range(0, 10, 0).is_err());
        // A deadline already passed.
        let mut b = Budget::new(6, Duration::ZERO);
        b.deadline = Instant::now().checked_sub(Duration::from_secs(1)).unwrap();
        assert_eq!(
            evaluate(&a, &e, Steps::instant(60_000), &mut b),
            Err(Error::Timeout(Duration::ZERO))
        );
    }
}
