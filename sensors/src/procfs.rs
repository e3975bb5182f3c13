//! Reading `/proc` text into reused buffers, and the small helpers every probe shares.

use std::io::Read;
use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use gma_core::event::EventData;
use gma_proto::v1::EventSchema;

use crate::{HostSensorConfig, Sensor, SensorError};

/// What sets one `/proc` sensor apart: its event, the files it reads and what a sample makes
/// of them. The rest — the source, the period, the reused read buffer and the [`Sensor`]
/// impl — is [`ProcSensor`].
pub(crate) trait Probe: Send {
    /// The event name, also the sensor's name.
    const NAME: &'static str;
    /// Starting capacity of the read buffer (the largest file read, roughly).
    const BUF_CAPACITY: usize = 4096;
    /// The schema of [`Probe::NAME`].
    fn schema() -> EventSchema;
    /// One sample (see [`Sensor::sample`]): read files into `buf`, push events through `out`.
    fn sample(&mut self, buf: &mut String, out: &mut Emit<'_>) -> Result<(), SensorError>;
}

/// Where a probe's sample goes: the sensor's source and period, the sample time, the events.
pub(crate) struct Emit<'a> {
    name: &'static str,
    /// The sensor's source (per-interface and per-device events append `/<name>` to it).
    pub(crate) source: &'a str,
    /// The sensor's period.
    pub(crate) period: Duration,
    /// The sample time, UTC ns.
    pub(crate) now_ns: i64,
    out: &'a mut Vec<EventData>,
}

impl Emit<'_> {
    /// Pushes one event from the sensor's source.
    pub(crate) fn push(&mut self, numbers: Vec<f64>, strings: Vec<String>) {
        let e = event(self.name, self.source, self.now_ns, numbers, strings);
        self.out.push(e);
    }

    /// Pushes one event from `source` (a `<host>/<iface>` or `<host>/<device>`).
    pub(crate) fn push_from(&mut self, source: &str, numbers: Vec<f64>, strings: Vec<String>) {
        let e = event(self.name, source, self.now_ns, numbers, strings);
        self.out.push(e);
    }
}

/// A [`Sensor`] made of a [`Probe`] and what every `/proc` sensor has.
pub(crate) struct ProcSensor<P> {
    source: String,
    period: Duration,
    buf: String,
    probe: P,
}

impl<P: Probe> ProcSensor<P> {
    pub(crate) fn new(source: &str, period: Duration, probe: P) -> ProcSensor<P> {
        ProcSensor {
            source: source.to_string(),
            period,
            buf: String::with_capacity(P::BUF_CAPACITY),
            probe,
        }
    }

    /// A host sensor: the config's source, sampled every `cfg.period`.
    pub(crate) fn host(cfg: &HostSensorConfig, probe: P) -> ProcSensor<P> {
        ProcSensor::new(&cfg.source, cfg.period, probe)
    }

    /// The probe's state, for tests.
    #[cfg(test)]
    pub(crate) fn probe(&self) -> &P {
        &self.probe
    }
}

impl<P: Probe> Sensor for ProcSensor<P> {
    fn name(&self) -> &str {
        P::NAME
    }

    fn schemas(&self) -> Vec<EventSchema> {
        vec![P::schema()]
    }

    fn period(&self) -> Duration {
        self.period
    }

    fn sample(&mut self, now_ns: i64, out: &mut Vec<EventData>) -> Result<(), SensorError> {
        let mut emit = Emit {
            name: P::NAME,
            source: &self.source,
            period: self.period,
            now_ns,
            out,
        };
        self.probe.sample(&mut self.buf, &mut emit)
    }
}

/// Reads `path` into `buf` (cleared first). The buffer lives in the sensor so a sample reuses
/// its allocation instead of growing a fresh `String` every period.
pub(crate) fn read_into(path: &Path, buf: &mut String) -> Result<(), SensorError> {
    buf.clear();
    std::fs::File::open(path)
        .and_then(|mut f| f.read_to_string(buf))
        .map(|_| ())
        .map_err(|source| SensorError::Io {
            path: path.to_path_buf(),
            source,
        })
}

/// Reads `path` and parses it with `parse`, naming `path` in any parse error.
pub(crate) fn read_parse<T>(
    path: &Path,
    buf: &mut String,
    parse: impl FnOnce(&str) -> Result<T, SensorError>,
) -> Result<T, SensorError> {
    read_into(path, buf)?;
    parse(buf).map_err(|e| e.in_file(path))
}

/// Parses one whitespace-separated token; `what` names it in the error.
pub(crate) fn parse_num<T: FromStr>(
    tok: Option<&str>,
    file: &str,
    line: usize,
    what: &str,
) -> Result<T, SensorError> {
    let tok = tok.ok_or_else(|| SensorError::parse(file, line, format!("missing {what}")))?;
    tok.parse().map_err(|_| {
        let shown: String = tok.chars().take(40).collect();
        SensorError::parse(file, line, format!("{what} {shown:?} is not a valid number"))
    })
}

/// Per-second rate of a monotonic counter. A counter that went backwards (wrapped, or the
/// device was reset or re-created) gives 0 for this sample rather than a negative or huge rate.
pub(crate) fn rate(prev: u64, cur: u64, dt_s: f64) -> f64 {
    cur.checked_sub(prev).map_or(0.0, |d| d as f64 / dt_s)
}

/// Seconds between two samples, or `None` when the clock did not move forward (a rate over a
/// zero or negative interval means nothing; the caller re-baselines instead).
pub(crate) fn elapsed_s(prev_ns: i64, now_ns: i64) -> Option<f64> {
    let d = now_ns.checked_sub(prev_ns)?;
    (d > 0).then(|| d as f64 / 1e9)
}

/// Kibibytes to mebibytes (the `_mb` fields are MiB, as `/proc/meminfo`'s "kB" are KiB).
pub(crate) fn kib_to_mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

pub(crate) fn event(
    name: &str,
    source: &str,
    timestamp_ns: i64,
    numbers: Vec<f64>,
    strings: Vec<String>,
) -> EventData {
    EventData {
        name: name.to_string(),
        source: source.to_string(),
        timestamp_ns,
        numbers,
        strings,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_never_go_negative() {
        assert_eq!(rate(10, 30, 2.0), 10.0);
        assert_eq!(rate(30, 10, 2.0), 0.0);
        assert_eq!(rate(u64::MAX, 0, 1.0), 0.0);
        assert_eq!(elapsed_s(5, 5), None);
        assert_eq!(elapsed_s(10, 5), None);
        assert_eq!(elapsed_s(i64::MIN, i64::MAX), None);
        assert_eq!(elapsed_s(0, 1_500_000_000), Some(1.5));
    }

    #[test]
    fn missing_file_names_the_path() {
        let mut buf = String::new();
        let err = read_into(Path::new("/nonexistent/gma/stat"), &mut buf).unwrap_err();
        assert!(
            err.to_string().starts_with("cannot read /nonexistent/gma/stat"),
            "{err}"
        );
    }
}
