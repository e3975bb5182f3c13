//! Metric names of the monitor (one place; prefix `gma_monitor_`, bounded labels).

/// Rule firings whose command ran; label `outcome` = ok | failed.
pub const FIRINGS: &str = "gma_monitor_firings_total";
/// Run time of firing commands, seconds.
pub const COMMAND_SECONDS: &str = "gma_monitor_command_seconds";

/// Describes the metrics above to the installed recorder.
pub fn describe() {
    use metrics::{describe_counter, describe_histogram, Unit};
    describe_counter!(FIRINGS, "rule firings whose command ran, by outcome (ok, failed)");
    describe_histogram!(COMMAND_SECONDS, Unit::Seconds, "run time of firing commands");
}
