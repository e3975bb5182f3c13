//! UTC wall clock in nanoseconds since the Unix epoch.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The largest valid event timestamp: 2099-12-31T23:59:59.999999999Z. Event timestamps are
/// nanoseconds since the Unix epoch in `1..=MAX_TIMESTAMP_NS`: never negative, and far enough
/// below `i64::MAX` that every time range over them (`[from, to)`, `to + 1`, a window's end)
/// stays representable and queryable. 0 is not a timestamp: at `Ingest` it asks for the
/// producer's clock.
pub const MAX_TIMESTAMP_NS: i64 = 4_102_444_799_999_999_999;

/// Whether `ns` is a valid event timestamp (`1..=MAX_TIMESTAMP_NS`).
pub fn valid_timestamp_ns(ns: i64) -> bool {
    (1..=MAX_TIMESTAMP_NS).contains(&ns)
}

/// [`valid_timestamp_ns`] with the message callers return (INVALID_ARGUMENT).
pub fn check_timestamp_ns(ns: i64) -> Result<(), crate::Error> {
    if valid_timestamp_ns(ns) {
        return Ok(());
    }
    Err(crate::Error::Value(format!(
        "timestamp_ns {ns} is outside the valid range 1..={MAX_TIMESTAMP_NS} (nanoseconds since \
         1970-01-01 up to the end of 2099); send nanoseconds since the Unix epoch, or 0 for the producer's clock"
    )))
}

/// Now, in nanoseconds since the Unix epoch (UTC).
pub fn now_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}

/// Now, in milliseconds since the Unix epoch (UTC).
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Days from 1970-01-01 to a proleptic Gregorian date (H. Hinnant's `days_from_civil`).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn days_in_month(y: i64, m: i64) -> i64 {
    match m {
        2 if (y % 4 == 0 && y % 100 != 0) || y % 400 == 0 => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Parses an RFC 3339 date-time (`YYYY-MM-DDTHH:MM:SS[.fraction](Z|+HH:MM|-HH:MM)`) into
/// nanoseconds since the Unix epoch.
/// `None`: not RFC 3339; `Some(None)`: a valid time outside the i64 nanosecond range.
pub fn parse_rfc3339(s: &str) -> Option<Option<i64>> {
    let b = s.as_bytes();
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        let part = b.get(r)?;
        if !part.iter().all(u8::is_ascii_digit) {
            return None;
        }
        std::str::from_utf8(part).ok()?.parse().ok()
    };
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || b[13] != b':' || b[16] != b':' {
        return None;
    }
    if !matches!(b[10], b'T' | b't' | b' ') {
        return None;
    }
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi, sec) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&mo) || d < 1 || d > days_in_month(y, mo) || h > 23 || mi > 59 || sec > 59 {
        return None;
    }
    let mut i = 19;
    let mut frac_ns = 0i64;
    if b[i] == b'.' {
        let start = i + 1;
        i = start;
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        let digits = &s[start..i];
        if digits.is_empty() || digits.len() > 9 {
            return None;
        }
        frac_ns = digits.parse::<i64>().ok()? * 10i64.pow(9 - digits.len() as u32);
    }
    let offset_s = match &s[i..] {
        "Z" | "z" => 0,
        tz if tz.len() == 6 && (tz.starts_with('+') || tz.starts_with('-')) && b[i + 3] == b':' => {
            let (oh, om) = (num(i + 1..i + 3)?, num(i + 4..i + 6)?);
            if oh > 23 || om > 59 {
                return None;
            }
            let o = oh * 3600 + om * 60;
            if tz.starts_with('-') {
                -o
            } else {
                o
            }
        }
        _ => return None,
    };
    let secs = days_from_civil(y, mo, d) * 86_400 + h * 3600 + mi * 60 + sec - offset_s;
    Some(
        secs.checked_mul(1_000_000_000)
            .and_then(|n| n.checked_add(frac_ns)),
    )
}

/// Parses a duration: a number and a unit (`ns`, `us`, `ms`, `s`, `m`, `h`, `d`, `w`), or
/// several (`1h30m`), into nanoseconds. A bare number is refused (say the unit).
pub fn parse_duration(s: &str) -> Result<i64, crate::Error> {
    let bad = |why: &str| {
        crate::Error::Value(format!(
            "duration {:?}: {why} (e.g. 90s, 15m, 1h30m, 7d)",
            crate::clip(s, 40)
        ))
    };
    if s.is_empty() {
        return Err(bad("empty"));
    }
    let mut total: i64 = 0;
    let mut rest = s;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return Err(bad("expected a number"));
        }
        let n: i64 = rest[..digits].parse().map_err(|_| bad("number too large"))?;
        rest = &rest[digits..];
        let unit_len = rest.bytes().take_while(u8::is_ascii_alphabetic).count();
        let unit = match &rest[..unit_len] {
            "ns" => 1,
            "us" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            "d" => 86_400_000_000_000,
            "w" => 604_800_000_000_000,
            "" => return Err(bad("missing unit")),
            _ => return Err(bad("unknown unit")),
        };
        rest = &rest[unit_len..];
        total = n
            .checked_mul(unit)
            .and_then(|v| total.checked_add(v))
            .ok_or_else(|| bad("too long"))?;
    }
    Ok(total)
}

/// Parses an instant for queries: `now`, a relative time `-15m` / `-1h30m` (before `now_ns`),
/// RFC 3339, `@UNIX_SECONDS[.fraction]` or integer nanoseconds.
pub fn parse_instant(s: &str, now_ns: i64) -> Result<i64, crate::Error> {
    let bad = || {
        crate::Error::Value(format!(
            "time {:?}: expected now, -DURATION (e.g. -15m), RFC 3339 (2024-05-01T12:00:00Z), @UNIX_SECONDS or integer nanoseconds",
            crate::clip(s, 40)
        ))
    };
    if s == "now" {
        return Ok(now_ns);
    }
    if let Some(d) = s.strip_prefix('-') {
        let d = parse_duration(d)
            .map_err(|e| crate::Error::Value(format!("time {:?}: {e}", crate::clip(s, 40))))?;
        return now_ns.checked_sub(d).ok_or_else(bad);
    }
    if let Some(secs) = s.strip_prefix('@') {
        let v: f64 = secs.parse().map_err(|_| bad())?;
        if !v.is_finite() || v.abs() > 9.2e9 {
            return Err(bad());
        }
        return Ok((v * 1e9).round() as i64);
    }
    if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) {
        return s.parse::<i64>().map_err(|_| bad());
    }
    match parse_rfc3339(s) {
        Some(Some(ns)) => Ok(ns),
        Some(None) => Err(crate::Error::Value(format!(
            "time {:?}: out of range (years 1678..2262)",
            crate::clip(s, 40)
        ))),
        None => Err(bad()),
    }
}

/// Formats nanoseconds since the epoch as RFC 3339 UTC with milliseconds.
pub fn format_rfc3339(ns: i64) -> String {
    let secs = ns.div_euclid(1_000_000_000);
    let ms = ns.rem_euclid(1_000_000_000) / 1_000_000;
    let days = secs.div_euclid(86_400);
    let sod = secs.rem_euclid(86_400);
    // Inverse of days_from_civil (H. Hinnant's civil_from_days).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{ms:03}Z",
        sod / 3600,
        sod % 3600 / 60,
        sod % 60
    )
}

/// Polls `pred` every 20 ms until it holds or `timeout` passes; whether it held. The blocking
/// wait on a condition with a deadline (the tests' kit, the throw-away Slurm cluster).
pub fn wait_until(timeout: Duration, mut pred: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if pred() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamp_range() {
        for ok in [1, now_ns(), MAX_TIMESTAMP_NS] {
            assert!(check_timestamp_ns(ok).is_ok(), "{ok}");
        }
        for bad in [0, -1, i64::MIN, i64::MAX, MAX_TIMESTAMP_NS + 1] {
            let e = check_timestamp_ns(bad).unwrap_err();
            assert!(
                e.to_string().contains(&format!("timestamp_ns {bad} is outside")),
                "{e}"
            );
        }
        // The bound is the last nanosecond of 2099.
        assert_eq!(
            parse_rfc3339("2100-01-01T00:00:00Z"),
            Some(Some(MAX_TIMESTAMP_NS + 1))
        );
    }

    #[test]
    fn instants_and_durations() {
        let now = 1_700_000_000_000_000_000;
        assert_eq!(parse_instant("now", now), Ok(now));
        assert_eq!(parse_instant("-15m", now), Ok(now - 900_000_000_000));
        assert_eq!(parse_instant("-1h30m", now), Ok(now - 5_400_000_000_000));
        assert_eq!(parse_instant("2023-11-14T22:13:20Z", now), Ok(now));
        assert_eq!(parse_instant("@1700000000", now), Ok(now));
        assert_eq!(parse_instant("1700000000000000000", now), Ok(now));
        assert!(parse_instant("yesterday", now)
            .unwrap_err()
            .to_string()
            .contains("expected now"));
        assert!(parse_instant("-15", now)
            .unwrap_err()
            .to_string()
            .contains("missing unit"));
        assert!(parse_instant("-15x", now)
            .unwrap_err()
            .to_string()
            .contains("unknown unit"));
        assert_eq!(parse_duration("7d"), Ok(7 * 86_400_000_000_000));
        assert!(parse_duration("99999999999999w").is_err());
        assert_eq!(format_rfc3339(now), "2023-11-14T22:13:20.000Z");
        assert_eq!(format_rfc3339(0), "1970-01-01T00:00:00.000Z");
        for ns in [0, 1, now, 951_782_400_123_000_000, -1_000_000] {
            let text = format_rfc3339(ns);
            let back = parse_instant(&text, 0).unwrap();
            assert_eq!(back, ns - ns.rem_euclid(1_000_000), "{text}");
        }
    }
}
