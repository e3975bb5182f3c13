//! Reading `/proc` text into reused buffers, and the small helpers every probe shares.

use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use gma_core::event::EventData;
use gma_proto::v1::EventSchema;

use crate::{HostSensorConfig, Sensor, SensorError};

/// What sets one `/proc` sensor apart: what a sample reads and makes of it. The rest — the
/// source, the period, the schema, the files' root and the reused read buffer, the [`Sensor`]
/// impl — is [`ProcSensor`].
pub(crate) trait Probe: Send {
    /// Starting capacity of the read buffer (the largest file read, roughly).
    const BUF_CAPACITY: usize = 4096;
    /// The probe runs host commands and may wait up to their timeouts ([`Sensor::blocking`]).
    const BLOCKING: bool = false;
    /// One sample (see [`Sensor::sample`]): read through `files`, push events through `out`.
    fn sample(&mut self, files: &mut Files, out: &mut Emit<'_>) -> Result<(), SensorError>;
}

/// The files a probe reads: paths below one root, read into one reused buffer.
pub(crate) struct Files {
    root: PathBuf,
    buf: String,
}

impl Files {
    /// Reads `file` below the root and parses it with `parse`, naming the path in any error.
    /// What `parse` returns may borrow the text.
    pub(crate) fn read<'b, T>(
        &'b mut self,
        file: &str,
        parse: impl FnOnce(&'b str) -> Result<T, SensorError>,
    ) -> Result<T, SensorError> {
        let path = self.root.join(file);
        read_parse(&path, &mut self.buf, parse)
    }

    /// [`Files::read`] of a file anywhere (`/etc/os-release`).
    pub(crate) fn read_at<'b, T>(
        &'b mut self,
        path: &Path,
        parse: impl FnOnce(&'b str) -> Result<T, SensorError>,
    ) -> Result<T, SensorError> {
        read_parse(path, &mut self.buf, parse)
    }
}

/// Where a probe's sample goes: the sensor's source and period, the sample time, the events.
pub(crate) struct Emit<'a> {
    name: &'a str,
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
    schema: EventSchema,
    files: Files,
    probe: P,
}

impl<P: Probe> ProcSensor<P> {
    /// Emits `schema`'s events from `source` every `period`, reading files below `root`.
    pub(crate) fn new(
        source: &str,
        period: Duration,
        root: &Path,
        schema: EventSchema,
        probe: P,
    ) -> ProcSensor<P> {
        ProcSensor {
            source: source.to_string(),
            period,
            schema,
            files: Files {
                root: root.to_path_buf(),
                buf: String::with_capacity(P::BUF_CAPACITY),
            },
            probe,
        }
    }

    /// A host sensor: the config's source, sampled every `cfg.period`, reading below `/proc`.
    pub(crate) fn host(cfg: &HostSensorConfig, schema: EventSchema, probe: P) -> ProcSensor<P> {
        ProcSensor::new(&cfg.source, cfg.period, &cfg.proc_root, schema, probe)
    }

    /// The probe's state, for tests.
    #[cfg(test)]
    pub(crate) fn probe(&self) -> &P {
        &self.probe
    }
}

impl<P: Probe> Sensor for ProcSensor<P> {
    fn name(&self) -> &str {
        &self.schema.name
    }

    fn schemas(&self) -> Vec<EventSchema> {
        vec![self.schema.clone()]
    }

    fn period(&self) -> Duration {
        self.period
    }

    fn blocking(&self) -> bool {
        P::BLOCKING
    }

    fn sample(&mut self, now_ns: i64, out: &mut Vec<EventData>) -> Result<(), SensorError> {
        let mut emit = Emit {
            name: &self.schema.name,
            source: &self.source,
            period: self.period,
            now_ns,
            out,
        };
        self.probe.sample(&mut self.files, &mut emit)
    }
}

/// Rates of the counters of named parts of a host (interfaces, block devices): a part's first
/// sighting is its baseline; later sightings give one event each, from `<source>/<part>` with
/// the part's name as its one string; a part missing from a sample is forgotten.
pub(crate) struct PartRates<C> {
    parts: HashMap<String, PartState<C>>,
    prev_ns: Option<i64>,
    /// Sample generation; a part whose `seen` is older has gone away.
    generation: u64,
}

struct PartState<C> {
    /// `<host>/<part>`, formatted once when the part first appears.
    source: String,
    prev: C,
    seen: u64,
}

impl<C> Default for PartRates<C> {
    fn default() -> PartRates<C> {
        PartRates {
            parts: HashMap::new(),
            prev_ns: None,
            generation: 0,
        }
    }
}

impl<C: Copy> PartRates<C> {
    /// One sample of `parts` (name, counters); `rates(prev, cur, seconds)` makes the numbers.
    pub(crate) fn sample<'t, const N: usize>(
        &mut self,
        parts: impl IntoIterator<Item = (&'t str, C)>,
        out: &mut Emit<'_>,
        rates: impl Fn(&C, &C, f64) -> [f64; N],
    ) {
        let dt = self.prev_ns.and_then(|p| elapsed_s(p, out.now_ns));
        self.generation += 1;
        for (name, counters) in parts {
            match self.parts.get_mut(name) {
                Some(st) => {
                    if let Some(dt) = dt {
                        let numbers = rates(&st.prev, &counters, dt).to_vec();
                        out.push_from(&st.source, numbers, vec![name.to_string()]);
                    }
                    st.prev = counters;
                    st.seen = self.generation;
                }
                None => {
                    let st = PartState {
                        source: format!("{}/{}", out.source, name),
                        prev: counters,
                        seen: self.generation,
                    };
                    self.parts.insert(name.to_string(), st);
                }
            }
        }
        let generation = self.generation;
        self.parts.retain(|_, st| st.seen == generation);
        self.prev_ns = Some(out.now_ns);
    }

    /// The parts known now, for tests.
    #[cfg(test)]
    pub(crate) fn names(&self) -> std::collections::HashSet<&str> {
        self.parts.keys().map(String::as_str).collect()
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
pub(crate) fn read_parse<'b, T>(
    path: &Path,
    buf: &'b mut String,
    parse: impl FnOnce(&'b str) -> Result<T, SensorError>,
) -> Result<T, SensorError> {
    read_into(path, buf)?;
    let text: &'b str = buf;
    parse(text).map_err(|e| e.in_file(path))
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
