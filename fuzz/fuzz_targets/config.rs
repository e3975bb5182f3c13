//! The TOML config loaders: `gma_core::config::parse_toml` into every role's config type that
//! a library crate exposes, plus the pure checks each role runs on what it parsed.
//!
//! - producer: `gma_producer::ProducerConfig` (+ `ProcessWatch::validate`, the summaries /
//!   forecasts event patterns, the source name — the side-effect-free part of `Producer::new`);
//! - simulation file: `gma_sensors::sim::SimConfig::from_toml` (parse + validate); a valid
//!   file with few hosts is then run: `simulation()`, three samples at fixed times, `set`/`get`;
//! - directory: `gma_directory::DirectoryConfig` + `validate` (with `parse_peers`), and
//!   `parse_peers` on the raw text;
//! - rescheduler: `gma_rescheduler::service::ReschedulerConfig`.
//!
//! Without feature `roles` (on by default) only the simulation file is covered.
//! The monitor and relay configs live in the `gma` binary crate (no library), so they are not
//! reachable from here.
//!
//! Input: lossy UTF-8 TOML text. Oracle besides "never panics": simulated events fit the
//! layout of the schema they are published under.
#![no_main]

#[cfg(feature = "roles")]
use gma_core::config::parse_toml;
use gma_core::event::{validate_schema, EventData, Layout};
#[cfg(feature = "roles")]
use gma_core::pattern::{event_patterns, validate_source};
#[cfg(feature = "roles")]
use gma_directory::{member::parse_peers, DirectoryConfig};
use gma_fuzz::MAX_INPUT;
#[cfg(feature = "roles")]
use gma_producer::ProducerConfig;
#[cfg(feature = "roles")]
use gma_rescheduler::service::ReschedulerConfig;
use gma_sensors::sim::{simulation, SimConfig};
use libfuzzer_sys::fuzz_target;

#[cfg(feature = "roles")]
const ORIGIN: &str = "fuzz.toml";
/// Simulations with more hosts are parsed and validated but not run (time per input).
const MAX_SIM_HOSTS: u64 = 64;
/// A fixed clock: 2023-11-14T22:13:20Z.
const T0: i64 = 1_700_000_000_000_000_000;

fn run_simulation(cfg: SimConfig) {
    let hosts = cfg.host.len() as u64 + cfg.generate.iter().map(|g| u64::from(g.count)).sum::<u64>();
    if hosts > MAX_SIM_HOSTS {
        return;
    }
    let (mut sensor, handle) = simulation(cfg);
    let schemas = sensor.schemas();
    for s in &schemas {
        assert!(validate_schema(s).is_ok(), "sim schema {} invalid", s.name);
    }
    let period = i64::try_from(sensor.period().as_nanos()).unwrap_or(i64::MAX);
    let mut out: Vec<EventData> = Vec::new();
    for i in 0..3i64 {
        let now = T0.saturating_add(period.saturating_mul(i));
        let _ = sensor.sample(now, &mut out);
        if i == 1 {
            // Change every host's values with what `get` reports (may be refused, e.g. NaN).
            for host in handle.hosts() {
                if let Some(values) = handle.get(&host) {
                    let values: Vec<(String, f64)> =
                        values.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
                    let _ = handle.set(&host, &values);
                }
                let _ = handle.set(&host, &[("load".to_string(), 3.5), ("cpus".to_string(), 2.0)]);
            }
        }
    }
    for e in &out {
        let s = schemas
            .iter()
            .find(|s| s.name == e.name)
            .unwrap_or_else(|| panic!("sim event {} has no schema", e.name));
        let l = Layout::of(&s.fields);
        assert_eq!(
            (e.numbers.len(), e.strings.len()),
            (l.doubles, l.strings),
            "sim event {} does not fit its schema",
            e.name
        );
    }
}

fuzz_target!(|data: &[u8]| {
    if data.len() > MAX_INPUT {
        return;
    }
    let text = String::from_utf8_lossy(data);
    if let Ok(cfg) = SimConfig::from_toml(&text) {
        run_simulation(cfg);
    }
    #[cfg(feature = "roles")]
    roles(&text);
});

/// The producer, directory and rescheduler configs (feature `roles`).
#[cfg(feature = "roles")]
fn roles(text: &str) {
    if let Ok(c) = parse_toml::<ProducerConfig>(text, ORIGIN) {
        for p in &c.process {
            let _ = p.validate();
        }
        let _ = event_patterns(&c.summaries);
        let _ = event_patterns(&c.forecasts);
        if let Some(s) = &c.source {
            let _ = validate_source(s);
        }
    }

    if let Ok(c) = parse_toml::<DirectoryConfig>(text, ORIGIN) {
        let _ = c.validate();
    }
    let _ = parse_peers(text);
    let _ = parse_toml::<ReschedulerConfig>(text, ORIGIN);
}
