//! The agent's CPU budget (`cpu_budget_pct`, docs/control.md): every `budget_check_ms` the
//! producer measures its own CPU (utime + stime of `/proc/self/stat` over the wall time) and
//! the share each sensor's sampling took (the wall time of its samples, [`crate::control::Slot`]).
//! Over budget, it doubles the period of its costliest sensor; when it fits again with room to
//! spare for undoing one step, it halves the period of a slowed sensor back toward the period
//! it had. Each change is a `gma.budget` event. Budget changes are not persisted: a restart
//! starts from the configured (or operator-set) periods and measures again.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use gma_core::event::{dbl, schema, text, EventData};
use gma_core::time::now_ns;
use gma_proto::v1 as pb;
use tokio::sync::watch;

pub use crate::control::Cost;
use crate::control::{Control, MAX_PERIOD_MS};

pub const GMA_BUDGET: &str = "gma.budget";

/// A slowed sensor comes back one step only when the agent's CPU plus that step's estimated
/// cost stays under this share of the budget (no flapping between two periods).
pub const RESTORE_HEADROOM: f64 = 0.8;

/// `gma.budget` (source = the producer): one period change made to keep the agent in budget.
pub fn budget_schema() -> pb::EventSchema {
    schema(
        GMA_BUDGET,
        "a sensor period the agent changed to keep its own CPU within cpu_budget_pct",
        vec![
            text("sensor", "the sensor whose period changed"),
            text("action", "slowed (over budget) or restored (fits again)"),
            dbl("old_period_ms", "ms", "the period before"),
            dbl("new_period_ms", "ms", "the period after"),
            dbl(
                "cpu_pct",
                "%",
                "the agent's CPU over the last check, percent of one CPU",
            ),
            dbl("budget_pct", "%", "cpu_budget_pct"),
            dbl(
                "sensor_cost_pct",
                "%",
                "the sensor's sampling over the last check (wall time of its samples), percent of one CPU",
            ),
        ],
    )
}

/// A period change the budget asks for.
#[derive(Debug, Clone, PartialEq)]
pub struct Change {
    pub sensor: String,
    pub slowed: bool,
    pub from_ms: u64,
    pub to_ms: u64,
    pub cost_pct: f64,
}

/// What to do after a check that measured `cpu_pct` against `budget_pct`: slow the costliest
/// sensor that can still be slowed (over budget), restore the cheapest slowed sensor by one step
/// when the estimate after it still fits with headroom, or nothing.
pub fn decide(cpu_pct: f64, budget_pct: f64, costs: &[Cost]) -> Option<Change> {
    if cpu_pct > budget_pct {
        let c = costs
            .iter()
            .filter(|c| c.enabled && c.period_ms < MAX_PERIOD_MS && c.cost_pct > 0.0)
            .max_by(|a, b| a.cost_pct.total_cmp(&b.cost_pct))?;
        return Some(Change {
            sensor: c.name.clone(),
            slowed: true,
            from_ms: c.period_ms,
            to_ms: c.period_ms.saturating_mul(2).min(MAX_PERIOD_MS),
            cost_pct: c.cost_pct,
        });
    }
    let c = costs
        .iter()
        .filter(|c| c.base_ms.is_some_and(|b| b < c.period_ms))
        .min_by(|a, b| a.cost_pct.total_cmp(&b.cost_pct))?;
    let base = c.base_ms.unwrap_or(c.period_ms);
    let to = (c.period_ms / 2).max(base);
    // Halving the period about doubles the sensor's cost: the estimate adds its cost again,
    // scaled by how much shorter the period gets.
    let added = c.cost_pct * (c.period_ms as f64 / to.max(1) as f64 - 1.0);
    if cpu_pct + added > budget_pct * RESTORE_HEADROOM {
        return None;
    }
    Some(Change {
        sensor: c.name.clone(),
        slowed: false,
        from_ms: c.period_ms,
        to_ms: to,
        cost_pct: c.cost_pct,
    })
}

/// CPU time of this process so far, seconds (utime + stime of `/proc/self/stat`).
fn own_cpu_s(ticks_per_s: f64) -> Option<f64> {
    let text = std::fs::read_to_string("/proc/self/stat").ok()?;
    let s = gma_sensors::agent::parse_self_stat(&text).ok()?;
    Some((s.utime + s.stime) as f64 / ticks_per_s)
}

/// Keeps the agent within `budget_pct` of one CPU, checking every `check`, until `stop`.
pub async fn run(control: Arc<Control>, budget_pct: f64, check: Duration, mut stop: watch::Receiver<bool>) {
    let auxv = std::fs::read(Path::new("/proc/self/auxv")).unwrap_or_default();
    let ticks = gma_sensors::agent::parse_auxv_clock_ticks(&auxv)
        .unwrap_or(gma_sensors::agent::DEFAULT_CLOCK_TICKS) as f64;
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + check, check);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_cpu = own_cpu_s(ticks);
    let mut last_at = Instant::now();
    let mut sampled: HashMap<String, u64> = HashMap::new();
    control.costs(&mut sampled, 1.0);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => return,
        }
        let now_cpu = own_cpu_s(ticks);
        let wall = last_at.elapsed().as_secs_f64().max(1e-3);
        last_at = Instant::now();
        let (Some(before), Some(after)) = (last_cpu, now_cpu) else {
            last_cpu = now_cpu;
            continue;
        };
        last_cpu = now_cpu;
        let cpu_pct = (after - before).max(0.0) / wall * 100.0;
        let costs = control.costs(&mut sampled, wall);
        control.set_measured(cpu_pct);
        let Some(change) = decide(cpu_pct, budget_pct, &costs) else {
            continue;
        };
        if !control.throttle(&change.sensor, change.to_ms) {
            continue;
        }
        tracing::info!(
            sensor = %change.sensor,
            from_ms = change.from_ms,
            to_ms = change.to_ms,
            cpu_pct,
            budget_pct,
            "{} a sensor to keep the agent within its CPU budget",
            if change.slowed { "slowed" } else { "restored" }
        );
        let ev = EventData {
            name: GMA_BUDGET.to_string(),
            source: control.source().to_string(),
            timestamp_ns: now_ns(),
            numbers: vec![
                change.from_ms as f64,
                change.to_ms as f64,
                cpu_pct,
                budget_pct,
                change.cost_pct,
            ],
            strings: vec![
                change.sensor.clone(),
                if change.slowed { "slowed" } else { "restored" }.to_string(),
            ],
        };
        control.publish(ev);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cost(name: &str, cost_pct: f64, period_ms: u64, base_ms: Option<u64>) -> Cost {
        Cost {
            name: name.into(),
            cost_pct,
            period_ms,
            base_ms,
            enabled: true,
        }
    }

    #[test]
    fn over_budget_slows_the_costliest_sensor() {
        let costs = [cost("a", 1.0, 100, None), cost("b", 9.0, 100, None)];
        let c = decide(12.0, 5.0, &costs).expect("a change");
        assert_eq!(
            (c.sensor.as_str(), c.slowed, c.from_ms, c.to_ms),
            ("b", true, 100, 200)
        );
    }

    #[test]
    fn a_sensor_at_the_longest_period_or_disabled_is_not_slowed() {
        let mut off = cost("b", 9.0, 100, None);
        off.enabled = false;
        let costs = [cost("a", 1.0, MAX_PERIOD_MS, None), off];
        assert_eq!(decide(12.0, 5.0, &costs), None);
    }

    #[test]
    fn fitting_with_headroom_restores_one_step_toward_the_base() {
        let costs = [cost("b", 1.0, 400, Some(100))];
        let c = decide(2.0, 5.0, &costs).expect("a restore");
        assert_eq!((c.slowed, c.from_ms, c.to_ms), (false, 400, 200));
        // Restoring would not leave headroom: stay.
        assert_eq!(decide(3.5, 5.0, &costs), None);
        // Nothing slowed: nothing to restore.
        assert_eq!(decide(0.1, 5.0, &[cost("a", 1.0, 100, None)]), None);
    }
}
