//! Metric names of the monitor (one place; prefix `gma_monitor_`, bounded labels).

gma_core::metric_names! {
    /// Rule firings whose command ran; label `outcome` = ok | failed.
    counter FIRINGS = "gma_monitor_firings_total", "rule firings whose command ran, by outcome (ok, failed)";
    /// Run time of firing commands, seconds.
    histogram(Seconds) COMMAND_SECONDS = "gma_monitor_command_seconds", "run time of firing commands";
}
