//! UTC wall clock in nanoseconds since the Unix epoch.

use std::time::{SystemTime, UNIX_EPOCH};

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
