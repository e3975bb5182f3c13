//! `app.contract`: the contract monitor of the job-migration rescheduler (GrADS, notes §1.3.2).
//!
//! An instrumented application reports how long each phase took; the monitor compares that
//! with the performance model's prediction and decides whether to ask the rescheduler for a
//! migration. [`ContractMonitor`] is a pure state machine: no I/O and no clock (the caller
//! passes `now_ns`), so the async shell only feeds reports and rescheduler answers in and
//! publishes what comes out.
//!
//! # The rules (notes §1.3.2, acceptance points 1-10 and 25)
//!
//! - `ratio = actual / predicted` per phase; the average is the arithmetic mean of **every**
//!   ratio since the application started (or restarted, see below). It is not a window.
//! - The average is evaluated only when the phase's ratio leaves `[lower, upper]`.
//! - **Upper rule**: `ratio > upper` and `average > upper` (both strict) raise one
//!   [`ContractOutput::MigrationRequest`], unless a request is already in flight (one per
//!   application; later crossings send nothing) or the application was stopped.
//! - **Lower rule**: `ratio < lower` and `average < lower` lower the lower limit to
//!   `average * (1 - LOWER_MARGIN)` (the upper limit is kept) and emit
//!   [`ContractOutput::LimitsAdjusted`]; the rescheduler is never contacted. The lowered limit
//!   sits below the average, so the same fast pace does not adjust again on every phase; an
//!   average of 0 lowers the limit to 0, which turns the lower rule off.
//! - **Refusal** ([`ContractMonitor::declined`]): the upper limit becomes
//!   `max(upper, max(average, r) * (1 + DECLINE_MARGIN))`, where `r` is the ratio of the phase
//!   that raised the request. Including `r`, not only the average, is what makes "the same
//!   slowdown does not re-request" hold for good: under a sustained ratio `r` the whole-history
//!   average climbs towards `r` but never past it, so it never crosses `1.05 r`; with the
//!   average alone it would cross again a few phases later. A worse slowdown (more than 5%
//!   above `r`) still requests.
//! - **Stop** ([`ContractMonitor::stopped`]): no requests until [`ContractMonitor::restarted`].
//! - **Restart resets the contract**: the ratio history is cleared and the limits go back to
//!   the configured ones. The old ratios measured the old machines under the old schedule;
//!   keeping them would carry the slowdown that caused the migration onto the new hosts, where
//!   the first transient crossing would find an inflated average and request again at once
//!   (thrash). Phase numbering continues across the restart (the application resumes at the
//!   phase after its checkpoint), and so does `fraction_completed`.
//!
//! # Progress
//!
//! `fraction_completed` counts work, in predicted seconds: on the first schedule it is
//! `sum(predicted of phases 0..=last reported) / sum(all predicted)`. Phases run in order, so a
//! phase whose report was lost (a gap) counts as done; it just adds no ratio. After a restart
//! at fraction `f0` the new schedule covers the remaining `1 - f0` of the work, so the fraction
//! is `f0 + (1 - f0) * done_new / total_new`: continuous across the restart, whatever the new
//! schedule's speed.
//!
//! # Outputs
//!
//! Every decision is returned twice, in this order: the typed output for the rescheduler link,
//! then the same decision as an `app.contract` [`EventData`] (with `kind` set) for the
//! producer to publish, so the archiver sees requests and adjustments too. A new phase always
//! starts the list with its `kind = "phase"` event, which carries the limits the ratio was
//! judged against.

use gma_core::event::{dbl, schema, text, EventData, MAX_STRING_VALUE};
use gma_core::pattern::{validate_source, PatternError};
use gma_proto::v1::EventSchema;

/// The event name of every contract-monitor event.
pub const APP_CONTRACT: &str = "app.contract";
/// `kind` of the event sent for each new phase report.
pub const KIND_PHASE: &str = "phase";
/// `kind` of the event that mirrors a [`ContractOutput::MigrationRequest`].
pub const KIND_MIGRATION_REQUEST: &str = "migration_request";
/// `kind` of the event that mirrors a [`ContractOutput::LimitsAdjusted`].
pub const KIND_LIMITS_ADJUSTED: &str = "limits_adjusted";
/// After a refusal the upper limit is put this fraction above the refused slowdown.
pub const DECLINE_MARGIN: f64 = 0.05;
/// The lower rule puts the lower limit this fraction below the average.
pub const LOWER_MARGIN: f64 = 0.05;

/// The schema (version 1) of `app.contract` (source = whatever the monitor was given, typically
/// the application's host or launcher). Doubles first, then strings, in this order.
pub fn contract_schema() -> EventSchema {
    schema(
        APP_CONTRACT,
        "contract monitor: per-phase actual vs predicted time, tolerance limits, \
                      migration requests and limit adjustments of one application",
        vec![
            dbl(
                "phase",
                "index",
                "0-based phase index; numbering continues across a restart (NaN on a limits_adjusted \
                 event before any phase was reported)",
            ),
            dbl(
                "actual_s",
                "s",
                "time the phase took (for migration_request and limits_adjusted: of the last phase)",
            ),
            dbl(
                "predicted_s",
                "s",
                "time the performance model predicted for the phase",
            ),
            dbl(
                "ratio",
                "ratio",
                "actual_s / predicted_s; above 1 is slower than predicted",
            ),
            dbl(
                "avg_ratio",
                "ratio",
                "mean of every ratio since the start or the last restart (NaN when none)",
            ),
            dbl(
                "upper",
                "ratio",
                "upper tolerance limit (after the adjustment on limits_adjusted)",
            ),
            dbl(
                "lower",
                "ratio",
                "lower tolerance limit (after the adjustment on limits_adjusted)",
            ),
            dbl(
                "fraction_completed",
                "fraction",
                "share of the application's work done, 0..1, in predicted seconds",
            ),
            text("app_id", "the monitored application"),
            text(
                "kind",
                "phase (one per phase report), migration_request or limits_adjusted",
            ),
        ],
    )
}

/// What the monitor watches: one application, its tolerance band and its predicted phases.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ContractConfig {
    pub app_id: String,
    /// Upper tolerance limit on `actual / predicted`; at least 1.
    pub upper: f64,
    /// Lower tolerance limit on `actual / predicted`; in (0, 1).
    pub lower: f64,
    /// Predicted time of each phase on the current schedule, seconds, each > 0.
    pub predicted_s: Vec<f64>,
}

/// Why the monitor moved its limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdjustReason {
    /// The rescheduler declined a migration request: the upper limit went up.
    Declined,
    /// The average fell below the lower limit: the lower limit went down.
    BelowLower,
}

impl AdjustReason {
    pub fn as_str(self) -> &'static str {
        match self {
            AdjustReason::Declined => "declined",
            AdjustReason::BelowLower => "below_lower",
        }
    }
}

/// One thing the monitor wants sent, in the order returned.
#[derive(Debug, Clone, PartialEq)]
pub enum ContractOutput {
    /// An `app.contract` event to publish.
    Event(EventData),
    /// Ask the rescheduler to consider migrating the application (ON_REQUEST mode).
    MigrationRequest {
        app_id: String,
        /// The 0-based phase whose report raised the request.
        phase: u32,
        avg_ratio: f64,
        fraction_completed: f64,
    },
    /// The tolerance limits changed; the new values.
    LimitsAdjusted {
        app_id: String,
        upper: f64,
        lower: f64,
        reason: AdjustReason,
    },
}

/// Why a configuration or a report was refused. Nothing changes in the monitor on an error.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ContractError {
    #[error("invalid contract config: {0}")]
    Config(String),
    #[error(transparent)]
    Source(#[from] PatternError),
    #[error("phase {phase} is beyond the schedule ({phases} phases, 0-based): restart with predicted times for it")]
    PhaseOutOfRange { phase: u32, phases: u64 },
    #[error("phase {phase}: actual time {actual_s} must be a finite number of seconds >= 0")]
    InvalidTime { phase: u32, actual_s: f64 },
}

/// The last phase report, kept for the events that are not about a new phase.
#[derive(Debug, Clone, Copy, PartialEq)]
struct PhaseRecord {
    phase: u32,
    actual_s: f64,
    predicted_s: f64,
    ratio: f64,
}

/// The contract monitor of one application. See the module docs for the rules.
#[derive(Debug, Clone)]
pub struct ContractMonitor {
    app_id: String,
    source: String,
    /// The configured limits, restored on restart.
    initial: (f64, f64),
    upper: f64,
    lower: f64,
    /// Predicted times of the current schedule; index 0 is phase `first_phase`.
    predicted: Vec<f64>,
    first_phase: u32,
    total_pred_s: f64,
    /// Predicted seconds of the current schedule's phases up to the last reported one.
    done_pred_s: f64,
    /// Fraction completed when the current schedule started.
    base_fraction: f64,
    last: Option<PhaseRecord>,
    ratio_sum: f64,
    ratio_count: u64,
    /// The ratio of the phase that raised the request the rescheduler is handling.
    in_flight: Option<f64>,
    stopped: bool,
}

fn validate_predicted(what: &str, predicted: &[f64]) -> Result<(), ContractError> {
    if predicted.is_empty() {
        return Err(ContractError::Config(format!(
            "{what} is empty: give the predicted time of every phase"
        )));
    }
    if let Some((i, p)) = predicted
        .iter()
        .enumerate()
        .find(|(_, p)| !(p.is_finite() && **p > 0.0))
    {
        return Err(ContractError::Config(format!(
            "{what}[{i}] = {p}: predicted times must be finite and > 0 seconds"
        )));
    }
    Ok(())
}

impl ContractMonitor {
    /// A monitor for `cfg.app_id` publishing as `source`, with nothing reported yet.
    pub fn new(cfg: ContractConfig, source: &str) -> Result<ContractMonitor, ContractError> {
        validate_source(source)?;
        if cfg.app_id.is_empty() || cfg.app_id.len() > MAX_STRING_VALUE {
            return Err(ContractError::Config(format!(
                "app_id must be 1 to {MAX_STRING_VALUE} bytes"
            )));
        }
        if !(cfg.lower.is_finite()
            && cfg.upper.is_finite()
            && 0.0 < cfg.lower
            && cfg.lower < 1.0
            && 1.0 <= cfg.upper)
        {
            return Err(ContractError::Config(format!(
                "limits lower {} upper {}: need 0 < lower < 1 <= upper",
                cfg.lower, cfg.upper
            )));
        }
        validate_predicted("predicted_s", &cfg.predicted_s)?;
        if u32::try_from(cfg.predicted_s.len()).is_err() {
            return Err(ContractError::Config("more phases than fit a u32".to_string()));
        }
        Ok(ContractMonitor {
            source: source.to_string(),
            initial: (cfg.upper, cfg.lower),
            upper: cfg.upper,
            lower: cfg.lower,
            total_pred_s: cfg.predicted_s.iter().sum(),
            predicted: cfg.predicted_s,
            first_phase: 0,
            done_pred_s: 0.0,
            base_fraction: 0.0,
            last: None,
            ratio_sum: 0.0,
            ratio_count: 0,
            in_flight: None,
            stopped: false,
            app_id: cfg.app_id,
        })
    }

    /// A monitor for an application that restarts from a checkpoint: the phases before
    /// `next_phase` were done by an earlier run (their work counts as done), and reports start
    /// at `next_phase`. A `next_phase` that leaves no phase to run is an error.
    pub fn from_checkpoint(
        cfg: ContractConfig,
        source: &str,
        next_phase: u32,
    ) -> Result<ContractMonitor, ContractError> {
        let mut m = ContractMonitor::new(cfg, source)?;
        let k = next_phase as usize;
        if k >= m.predicted.len() {
            return Err(ContractError::PhaseOutOfRange {
                phase: next_phase,
                phases: m.predicted.len() as u64,
            });
        }
        let done: f64 = m.predicted[..k].iter().sum();
        m.base_fraction = done / m.total_pred_s;
        m.predicted.drain(..k);
        m.total_pred_s = m.predicted.iter().sum();
        m.first_phase = next_phase;
        Ok(m)
    }

    /// An application's report that phase `phase` (0-based) took `actual_s` seconds.
    ///
    /// Returns, in order: the `kind = "phase"` event; then, if a rule fired, either a
    /// `MigrationRequest` or a `LimitsAdjusted`, each followed by its own event. A duplicate
    /// or out-of-order phase (`<=` the last reported) changes nothing and returns nothing. A
    /// phase beyond the schedule or an `actual_s` that is not a finite number `>= 0` is an
    /// error and changes nothing.
    pub fn report(
        &mut self,
        phase: u32,
        actual_s: f64,
        now_ns: i64,
    ) -> Result<Vec<ContractOutput>, ContractError> {
        if self.last.is_some_and(|l| phase <= l.phase) {
            return Ok(Vec::new());
        }
        let idx = phase
            .checked_sub(self.first_phase)
            .map(|i| i as usize)
            .filter(|&i| i < self.predicted.len())
            .ok_or(ContractError::PhaseOutOfRange {
                phase,
                phases: u64::from(self.first_phase) + self.predicted.len() as u64,
            })?;
        if !(actual_s.is_finite() && actual_s >= 0.0) {
            return Err(ContractError::InvalidTime { phase, actual_s });
        }
        let predicted_s = self.predicted[idx];
        let ratio = actual_s / predicted_s;

        // Work done: every phase of this schedule up to this one (a lost report is still work).
        let from = match self.last {
            Some(l) if l.phase >= self.first_phase => (l.phase - self.first_phase) as usize + 1,
            _ => 0,
        };
        self.done_pred_s += self.predicted[from..=idx].iter().sum::<f64>();
        self.ratio_sum += ratio;
        self.ratio_count += 1;
        let record = PhaseRecord {
            phase,
            actual_s,
            predicted_s,
            ratio,
        };
        self.last = Some(record);

        let mut out = vec![ContractOutput::Event(self.event(
            Some(record),
            KIND_PHASE,
            now_ns,
        ))];
        let avg = self.average();
        if ratio > self.upper {
            if avg > self.upper && self.in_flight.is_none() && !self.stopped {
                self.in_flight = Some(ratio);
                out.push(ContractOutput::MigrationRequest {
                    app_id: self.app_id.clone(),
                    phase,
                    avg_ratio: avg,
                    fraction_completed: self.fraction_completed(),
                });
                out.push(ContractOutput::Event(self.event(
                    Some(record),
                    KIND_MIGRATION_REQUEST,
                    now_ns,
                )));
            }
        } else if ratio < self.lower && avg < self.lower {
            self.lower = avg * (1.0 - LOWER_MARGIN);
            out.push(self.adjusted(AdjustReason::BelowLower));
            out.push(ContractOutput::Event(self.event(
                Some(record),
                KIND_LIMITS_ADJUSTED,
                now_ns,
            )));
        }
        Ok(out)
    }

    /// The rescheduler declined to migrate (STAY in ON_REQUEST mode): raise the upper limit to
    /// `max(upper, max(average, r) * (1 + DECLINE_MARGIN))`, `r` the ratio of the phase that
    /// raised the request (the last ratio if none is in flight), and clear the in-flight
    /// request. Returns `LimitsAdjusted` and its event (which carries the last phase's values).
    /// Always answers, even if the limits did not move, so every refusal is on record.
    pub fn declined(&mut self, now_ns: i64) -> Vec<ContractOutput> {
        let r = self.in_flight.take().or(self.last.map(|l| l.ratio));
        // f64::max ignores NaN: with no history the limit stays where it is.
        let base = r.map_or(self.average(), |r| self.average().max(r));
        self.upper = self.upper.max(base * (1.0 + DECLINE_MARGIN));
        vec![
            self.adjusted(AdjustReason::Declined),
            ContractOutput::Event(self.event(self.last, KIND_LIMITS_ADJUSTED, now_ns)),
        ]
    }

    /// The rescheduler decided MIGRATE and stopped the application: no requests until
    /// [`ContractMonitor::restarted`]. Phase reports are still taken (the application may finish
    /// a phase before it sees the stop).
    pub fn stopped(&mut self) {
        self.stopped = true;
        self.in_flight = None;
    }

    /// The application restarted on a new schedule; `predicted_remaining_s` are the predicted
    /// times of the phases after the last reported one (all phases if none was reported).
    ///
    /// Resets the contract: ratio history cleared, limits back to the configured ones, no
    /// request in flight, not stopped (see the module docs for why). `fraction_completed`
    /// carries over. An empty list or a time that is not finite and > 0 is an error and
    /// changes nothing.
    pub fn restarted(&mut self, predicted_remaining_s: Vec<f64>) -> Result<(), ContractError> {
        validate_predicted("predicted_remaining_s", &predicted_remaining_s)?;
        let first = self.last.map_or(Some(0), |l| l.phase.checked_add(1));
        let first = first
            .filter(|f| u32::try_from(predicted_remaining_s.len()).is_ok_and(|n| f.checked_add(n).is_some()))
            .ok_or_else(|| ContractError::Config("phase numbers past u32::MAX".to_string()))?;
        self.base_fraction = self.fraction_completed();
        self.first_phase = first;
        self.total_pred_s = predicted_remaining_s.iter().sum();
        self.predicted = predicted_remaining_s;
        self.done_pred_s = 0.0;
        self.ratio_sum = 0.0;
        self.ratio_count = 0;
        (self.upper, self.lower) = self.initial;
        self.in_flight = None;
        self.stopped = false;
        Ok(())
    }

    /// Mean ratio since the start or the last restart; NaN before the first report.
    pub fn average(&self) -> f64 {
        if self.ratio_count == 0 {
            f64::NAN
        } else {
            self.ratio_sum / self.ratio_count as f64
        }
    }

    /// The current `(upper, lower)` tolerance limits.
    pub fn limits(&self) -> (f64, f64) {
        (self.upper, self.lower)
    }

    /// Share of the work done, 0..=1 (see the module docs).
    pub fn fraction_completed(&self) -> f64 {
        let f = self.base_fraction + (1.0 - self.base_fraction) * self.done_pred_s / self.total_pred_s;
        f.clamp(0.0, 1.0)
    }

    /// Whether a migration request awaits the rescheduler's answer.
    pub fn request_in_flight(&self) -> bool {
        self.in_flight.is_some()
    }

    /// Whether the application was stopped and has not restarted yet.
    pub fn is_stopped(&self) -> bool {
        self.stopped
    }

    pub fn app_id(&self) -> &str {
        &self.app_id
    }

    /// Predicted seconds of the whole current schedule (since the last restart).
    pub fn total_predicted_s(&self) -> f64 {
        self.total_pred_s
    }

    fn adjusted(&self, reason: AdjustReason) -> ContractOutput {
        ContractOutput::LimitsAdjusted {
            app_id: self.app_id.clone(),
            upper: self.upper,
            lower: self.lower,
            reason,
        }
    }

    fn event(&self, phase: Option<PhaseRecord>, kind: &str, now_ns: i64) -> EventData {
        let (p, actual, predicted, ratio) = phase.map_or((f64::NAN, f64::NAN, f64::NAN, f64::NAN), |r| {
            (f64::from(r.phase), r.actual_s, r.predicted_s, r.ratio)
        });
        EventData {
            name: APP_CONTRACT.to_string(),
            source: self.source.clone(),
            timestamp_ns: now_ns,
            numbers: vec![
                p,
                actual,
                predicted,
                ratio,
                self.average(),
                self.upper,
                self.lower,
                self.fraction_completed(),
            ],
            strings: vec![self.app_id.clone(), kind.to_string()],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gma_core::event::{from_wire, to_wire, validate_schema};

    const UP: f64 = 1.5;
    const LO: f64 = 0.5;

    fn monitor(phases: usize) -> ContractMonitor {
        ContractMonitor::new(
            ContractConfig {
                app_id: "qr-8000".into(),
                upper: UP,
                lower: LO,
                predicted_s: vec![100.0; phases],
            },
            "launcher/qr",
        )
        .unwrap()
    }

    #[test]
    fn a_monitor_from_a_checkpoint_counts_the_earlier_phases_as_done() {
        let cfg = ContractConfig {
            app_id: "qr-8000".into(),
            upper: UP,
            lower: LO,
            predicted_s: vec![100.0; 4],
        };
        let mut m = ContractMonitor::from_checkpoint(cfg.clone(), "launcher/qr", 2).unwrap();
        assert_eq!(m.fraction_completed(), 0.5);
        // Phases before the checkpoint are out of its schedule; the next one is taken.
        assert!(m.report(1, 100.0, 1).is_err());
        feed(&mut m, 2, &[1.0]);
        assert_eq!(m.fraction_completed(), 0.75);
        feed(&mut m, 3, &[1.0]);
        assert_eq!(m.fraction_completed(), 1.0);
        assert!(m.report(4, 100.0, 2).is_err());
        // A checkpoint with nothing left to run is refused.
        assert!(ContractMonitor::from_checkpoint(cfg, "launcher/qr", 4).is_err());
    }

    /// Feeds ratios (predicted 100 s each) from phase `first`, returning every output.
    fn feed(m: &mut ContractMonitor, first: u32, ratios: &[f64]) -> Vec<Vec<ContractOutput>> {
        ratios
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let p = first + i as u32;
                m.report(p, r * 100.0, 1_000 + i64::from(p)).unwrap()
            })
            .collect()
    }

    fn requests(outs: &[ContractOutput]) -> Vec<(u32, f64)> {
        outs.iter()
            .filter_map(|o| match o {
                ContractOutput::MigrationRequest { phase, avg_ratio, .. } => Some((*phase, *avg_ratio)),
                _ => None,
            })
            .collect()
    }

    fn adjustments(outs: &[ContractOutput]) -> Vec<(f64, f64, AdjustReason)> {
        outs.iter()
            .filter_map(|o| match o {
                ContractOutput::LimitsAdjusted {
                    upper, lower, reason, ..
                } => Some((*upper, *lower, *reason)),
                _ => None,
            })
            .collect()
    }

    fn kinds(outs: &[ContractOutput]) -> Vec<String> {
        outs.iter()
            .map(|o| match o {
                ContractOutput::Event(e) => format!("event:{}", e.strings[1]),
                ContractOutput::MigrationRequest { .. } => "request".into(),
                ContractOutput::LimitsAdjusted { .. } => "adjusted".into(),
            })
            .collect()
    }

    fn all(outs: &[Vec<ContractOutput>]) -> Vec<ContractOutput> {
        outs.iter().flatten().cloned().collect()
    }

    #[test]
    fn schema_is_valid_and_events_conform() {
        let schema = contract_schema();
        validate_schema(&schema).unwrap();
        assert!(schema.fields.iter().all(|f| !f.description.is_empty()));
        let mut m = monitor(4);
        let mut outs = all(&feed(&mut m, 0, &[1.0, 2.0, 2.0]));
        outs.extend(m.declined(9));
        outs.extend(m.report(3, 10.0, 10).unwrap());
        let mut n = 0;
        for o in outs {
            if let ContractOutput::Event(e) = o {
                let wire = to_wire(
                    &e.name,
                    &e.source,
                    e.timestamp_ns,
                    0,
                    &schema.fields,
                    &e.numbers,
                    &e.strings,
                );
                let back = from_wire(&wire, &schema).unwrap();
                assert_eq!(back.strings, e.strings);
                assert_eq!(back.numbers.len(), 8);
                n += 1;
            }
        }
        assert_eq!(n, 6, "3 phase + 1 request + 1 declined + 1 phase");
    }

    /// Point 1: one event per phase with every field; 120 s for 100 s predicted is ratio 1.2.
    #[test]
    fn phase_event_fields() {
        let mut m = ContractMonitor::new(
            ContractConfig {
                app_id: "app".into(),
                upper: UP,
                lower: LO,
                predicted_s: vec![100.0, 300.0],
            },
            "h1",
        )
        .unwrap();
        let out = m.report(0, 120.0, 42).unwrap();
        let [ContractOutput::Event(e)] = out.as_slice() else {
            panic!("{out:?}")
        };
        assert_eq!(
            (e.name.as_str(), e.source.as_str(), e.timestamp_ns),
            (APP_CONTRACT, "h1", 42)
        );
        assert_eq!(e.numbers, vec![0.0, 120.0, 100.0, 1.2, 1.2, UP, LO, 0.25]);
        assert_eq!(e.strings, vec!["app".to_string(), "phase".to_string()]);
        assert_eq!(m.fraction_completed(), 0.25);
    }

    /// Point 3: a single outlier (average 1.25) does not request.
    #[test]
    fn transient_outlier_filtered() {
        let mut m = monitor(4);
        let outs = all(&feed(&mut m, 0, &[1.0, 1.0, 1.0, 2.0]));
        assert!(requests(&outs).is_empty());
        assert_eq!(m.average(), 1.25);
    }

    /// Point 4 (and 25): [1, 2, 2, 2] requests exactly once, at the third phase (index 2), with
    /// the average 5/3; the fourth crossing is in flight and sends nothing.
    #[test]
    fn sustained_slowdown_requests_once() {
        let mut m = monitor(4);
        let outs = feed(&mut m, 0, &[1.0, 2.0, 2.0, 2.0]);
        // Phase index 1: ratio 2 > 1.5 but the average is exactly 1.5, not above.
        assert_eq!(kinds(&outs[1]), vec!["event:phase"]);
        assert_eq!(
            kinds(&outs[2]),
            vec!["event:phase", "request", "event:migration_request"]
        );
        assert_eq!(kinds(&outs[3]), vec!["event:phase"]);
        let reqs = requests(&all(&outs));
        assert_eq!(reqs.len(), 1);
        assert_eq!(reqs[0].0, 2);
        assert!((reqs[0].1 - 5.0 / 3.0).abs() < 1e-12);
        assert!(m.request_in_flight());
        let ContractOutput::MigrationRequest {
            app_id,
            fraction_completed,
            ..
        } = &outs[2][1]
        else {
            panic!()
        };
        assert_eq!((app_id.as_str(), *fraction_completed), ("qr-8000", 0.75));
        let ContractOutput::Event(e) = &outs[2][2] else {
            panic!()
        };
        assert_eq!(e.numbers[0], 2.0);
        assert_eq!(e.numbers[3], 2.0);
    }

    /// Point 5: the average runs over the whole history, not a window: after ten phases at 1.0,
    /// ratio 2.0 needs eleven phases before the average passes 1.5.
    #[test]
    fn average_over_full_history() {
        let mut m = monitor(40);
        let mut ratios = vec![1.0; 10];
        ratios.extend([2.0; 12]);
        let reqs = requests(&all(&feed(&mut m, 0, &ratios)));
        // (10 + 2k) / (10 + k) > 1.5 first at k = 11: phase index 20.
        assert_eq!(reqs.len(), 1);
        assert_eq!(reqs[0].0, 20);
    }

    /// Point 6: the average is only looked at on a crossing. An average above `upper` with no
    /// request in flight is only reachable by seeding (every route there crosses with the
    /// average above), so this test seeds the history directly.
    #[test]
    fn only_checked_on_crossing() {
        let mut m = monitor(4);
        m.ratio_sum = 2.0 * 5.0;
        m.ratio_count = 5;
        let out = m.report(0, 140.0, 1).unwrap(); // ratio 1.4, inside the band
        assert_eq!(kinds(&out), vec!["event:phase"]);
        assert!(m.average() > UP);
        let out = m.report(1, 160.0, 2).unwrap(); // ratio 1.6 crosses
        assert_eq!(requests(&out).len(), 1);
        // The same holds at the bottom: a ratio inside the band adjusts nothing.
        let mut m = monitor(4);
        m.ratio_sum = 0.1;
        m.ratio_count = 1;
        let out = m.report(0, 60.0, 1).unwrap();
        assert_eq!(kinds(&out), vec!["event:phase"]);
        assert_eq!(m.limits(), (UP, LO));
    }

    /// Point 7: a refusal raises the upper limit above the average, and the same slowdown then
    /// never requests again, however long it lasts; a clearly worse one does.
    #[test]
    fn refusal_raises_upper() {
        let mut m = monitor(40);
        feed(&mut m, 0, &[1.0, 2.0, 2.0]);
        let avg = m.average();
        let out = m.declined(7);
        assert_eq!(kinds(&out), vec!["adjusted", "event:limits_adjusted"]);
        let (upper, lower, reason) = adjustments(&out)[0];
        assert_eq!(
            (upper, lower, reason),
            (2.0 * (1.0 + DECLINE_MARGIN), LO, AdjustReason::Declined)
        );
        assert!(upper >= avg);
        assert_eq!(m.limits(), (upper, LO));
        assert!(!m.request_in_flight());
        let ContractOutput::Event(e) = &out[1] else {
            panic!()
        };
        assert_eq!(
            (e.numbers[0], e.numbers[5], e.strings[1].as_str()),
            (2.0, upper, "limits_adjusted")
        );
        // The same ratio again, for many phases: nothing.
        let outs = all(&feed(&mut m, 3, &[2.0; 20]));
        assert!(requests(&outs).is_empty() && adjustments(&outs).is_empty());
        // A worse slowdown crosses and, once the average follows, requests again.
        let outs = all(&feed(&mut m, 23, &[3.0; 5]));
        assert_eq!(requests(&outs).len(), 1);
    }

    /// The refusal rule keeps the upper limit when it is already high enough.
    #[test]
    fn refusal_never_lowers_upper() {
        let mut m = ContractMonitor::new(
            ContractConfig {
                app_id: "a".into(),
                upper: 5.0,
                lower: LO,
                predicted_s: vec![1.0; 3],
            },
            "s",
        )
        .unwrap();
        m.report(0, 2.0, 0).unwrap();
        let out = m.declined(1);
        assert_eq!(adjustments(&out)[0].0, 5.0);
        // No history at all: still answers, limits unchanged, NaN phase fields.
        let mut m = monitor(2);
        let out = m.declined(1);
        assert_eq!(adjustments(&out)[0].0, UP);
        let ContractOutput::Event(e) = &out[1] else {
            panic!()
        };
        assert!(e.numbers[0].is_nan() && e.numbers[4].is_nan());
    }

    /// Point 8: fast phases lower the lower limit to average * 0.95, once, and never request.
    #[test]
    fn lower_rule_adjusts_without_request() {
        let mut m = monitor(4);
        let outs = feed(&mut m, 0, &[0.4, 0.4, 0.4]);
        assert_eq!(
            kinds(&outs[0]),
            vec!["event:phase", "adjusted", "event:limits_adjusted"]
        );
        let adj = adjustments(&all(&outs));
        assert_eq!(adj.len(), 1, "0.4 is not below the new lower limit 0.38");
        assert_eq!(adj[0].0, UP);
        assert!((adj[0].1 - 0.38).abs() < 1e-12);
        assert_eq!(adj[0].2, AdjustReason::BelowLower);
        assert!(requests(&all(&outs)).is_empty());
        assert!(!m.request_in_flight());
        // A ratio below the band whose average is not below it adjusts nothing.
        let mut m = monitor(4);
        let outs = all(&feed(&mut m, 0, &[1.0, 0.3]));
        assert!(adjustments(&outs).is_empty());
    }

    /// Point 9: after a stop no requests until restart; reports are still taken.
    #[test]
    fn no_requests_after_stop() {
        let mut m = monitor(10);
        let outs = all(&feed(&mut m, 0, &[2.0]));
        assert_eq!(requests(&outs).len(), 1);
        m.stopped();
        assert!(m.is_stopped() && !m.request_in_flight());
        let outs = all(&feed(&mut m, 1, &[3.0, 3.0]));
        assert!(requests(&outs).is_empty());
        assert_eq!(outs.len(), 2, "phase events only");
        m.restarted(vec![100.0; 7]).unwrap();
        assert!(!m.is_stopped());
        let outs = all(&feed(&mut m, 3, &[2.0]));
        assert_eq!(requests(&outs).len(), 1);
    }

    /// Point 10: a duplicate or older report changes nothing and returns nothing.
    #[test]
    fn duplicates_ignored() {
        let mut m = monitor(4);
        feed(&mut m, 0, &[1.0, 2.0, 2.0]);
        let (avg, frac) = (m.average(), m.fraction_completed());
        assert!(m.report(2, 200.0, 5).unwrap().is_empty());
        assert!(m.report(1, 900.0, 5).unwrap().is_empty());
        assert!(m.report(0, f64::NAN, 5).unwrap().is_empty());
        assert_eq!((m.average(), m.fraction_completed()), (avg, frac));
        m.declined(6);
        assert!(
            m.report(2, 200.0, 7).unwrap().is_empty(),
            "no second request either"
        );
    }

    /// Point 5's design choice: a restart clears the history and restores the configured limits;
    /// numbering and progress continue.
    #[test]
    fn restart_resets_history_and_limits() {
        let mut m = monitor(4);
        feed(&mut m, 0, &[2.0, 2.0]);
        m.declined(1);
        assert!(m.limits().0 > UP);
        assert_eq!(m.fraction_completed(), 0.5);
        m.stopped();
        // The new schedule is twice as fast: two phases of 50 s each.
        m.restarted(vec![50.0, 50.0]).unwrap();
        assert!(m.average().is_nan());
        assert_eq!(m.limits(), (UP, LO));
        assert_eq!(m.fraction_completed(), 0.5, "continuous across the restart");
        assert!(
            m.report(1, 50.0, 2).unwrap().is_empty(),
            "phase 1 was already reported"
        );
        let out = m.report(2, 50.0, 3).unwrap();
        let ContractOutput::Event(e) = &out[0] else {
            panic!()
        };
        assert_eq!(
            (e.numbers[0], e.numbers[2], e.numbers[3], e.numbers[4]),
            (2.0, 50.0, 1.0, 1.0)
        );
        assert_eq!(m.fraction_completed(), 0.75);
        // One transient crossing on the new hosts: the fresh average filters it.
        let out = m.report(3, 100.0, 4).unwrap();
        assert!(requests(&out).is_empty());
        assert_eq!(m.average(), 1.5);
        assert_eq!(m.fraction_completed(), 1.0);
        assert!(matches!(
            m.report(4, 1.0, 5),
            Err(ContractError::PhaseOutOfRange { phase: 4, phases: 4 })
        ));
    }

    #[test]
    fn restart_before_any_report_replaces_the_schedule() {
        let mut m = monitor(4);
        m.restarted(vec![10.0, 30.0]).unwrap();
        m.report(0, 10.0, 1).unwrap();
        assert_eq!(m.fraction_completed(), 0.25);
        assert!(m.report(2, 1.0, 1).is_err());
        assert!(m.restarted(vec![]).is_err());
        assert!(m.restarted(vec![1.0, 0.0]).is_err());
        assert_eq!(m.total_predicted_s(), 40.0, "a refused restart changes nothing");
    }

    /// A lost report: its work counts as done, it adds no ratio.
    #[test]
    fn gap_counts_work_not_ratio() {
        let mut m = monitor(4);
        m.report(0, 100.0, 1).unwrap();
        m.report(2, 300.0, 2).unwrap();
        assert_eq!(m.fraction_completed(), 0.75);
        assert_eq!(m.average(), 2.0);
    }

    #[test]
    fn bad_reports_and_configs_are_errors() {
        let mut m = monitor(2);
        assert!(matches!(
            m.report(2, 1.0, 0),
            Err(ContractError::PhaseOutOfRange { .. })
        ));
        for bad in [f64::NAN, f64::INFINITY, -1.0] {
            assert!(matches!(
                m.report(0, bad, 0),
                Err(ContractError::InvalidTime { .. })
            ));
        }
        assert!(m.average().is_nan() && m.fraction_completed() == 0.0);
        assert_eq!(kinds(&m.report(0, 0.0, 0).unwrap())[0], "event:phase");

        let cfg = |upper: f64, lower: f64, predicted_s: Vec<f64>| ContractConfig {
            app_id: "a".into(),
            upper,
            lower,
            predicted_s,
        };
        for (u, l) in [
            (1.5, 0.0),
            (1.5, 1.0),
            (0.9, 0.5),
            (f64::NAN, 0.5),
            (f64::INFINITY, 0.5),
        ] {
            assert!(
                ContractMonitor::new(cfg(u, l, vec![1.0]), "s").is_err(),
                "{u} {l}"
            );
        }
        assert!(ContractMonitor::new(cfg(1.0, 0.5, vec![1.0]), "s").is_ok());
        assert!(ContractMonitor::new(cfg(1.5, 0.5, vec![]), "s").is_err());
        assert!(ContractMonitor::new(cfg(1.5, 0.5, vec![1.0, -1.0]), "s").is_err());
        assert!(ContractMonitor::new(cfg(1.5, 0.5, vec![1.0]), "bad source").is_err());
        let mut c = cfg(1.5, 0.5, vec![1.0]);
        c.app_id.clear();
        assert!(ContractMonitor::new(c, "s").is_err());
    }

    /// The wire contract: field names, types and units, in order.
    #[test]
    fn contract_schema_is_pinned() {
        assert_eq!(
            gma_core::event::signature(&contract_schema()),
            "app.contract v1: phase double index, actual_s double s, predicted_s double s, ratio double ratio, avg_ratio double ratio, upper double ratio, lower double ratio, fraction_completed double fraction, app_id string, kind string"
        );
    }
}
