//! Reading `/proc` text into reused buffers, and the small helpers every probe shares.

use std::io::Read;
use std::path::Path;
use std::str::FromStr;

use gma_core::event::EventData;

use crate::SensorError;

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
