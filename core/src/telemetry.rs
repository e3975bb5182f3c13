//! One way for a crate to declare its Prometheus metrics: [`crate::metric_names!`] writes each
//! name once, as a `pub const`, and the crate's `describe()` that registers every HELP line
//! (and unit) with the installed recorder.

/// The `metrics` crate, for the expansion of [`crate::metric_names!`] in crates that do not
/// name it themselves.
#[doc(hidden)]
pub use metrics as __metrics;

/// Declares a crate's metrics: for each, a `pub const NAME: &str` holding the metric name and
/// a line in the generated `pub fn describe()`. A metric is `counter`, `gauge`, `histogram`,
/// or `histogram(Unit)` with a [`metrics::Unit`] variant; doc comments go on the constant.
///
/// ```
/// gma_core::metric_names! {
///     /// Events kept.
///     counter EVENTS = "gma_example_events_total", "events kept";
///     gauge OPEN = "gma_example_open", "streams open";
///     histogram(Seconds) TOOK = "gma_example_seconds", "time per call";
/// }
/// describe();
/// assert_eq!(EVENTS, "gma_example_events_total");
/// ```
#[macro_export]
macro_rules! metric_names {
    ($($(#[$doc:meta])* $kind:ident $(($unit:ident))? $name:ident = $metric:literal, $help:literal;)*) => {
        $($(#[$doc])* pub const $name: &str = $metric;)*

        /// Registers the descriptions (HELP lines) of this crate's metrics with the installed
        /// recorder.
        pub fn describe() {
            $($crate::metric_names!(@describe $kind $(($unit))? $name, $help);)*
        }
    };
    (@describe counter $name:ident, $help:literal) => {
        $crate::telemetry::__metrics::describe_counter!($name, $help)
    };
    (@describe gauge $name:ident, $help:literal) => {
        $crate::telemetry::__metrics::describe_gauge!($name, $help)
    };
    (@describe histogram $name:ident, $help:literal) => {
        $crate::telemetry::__metrics::describe_histogram!($name, $help)
    };
    (@describe histogram($unit:ident) $name:ident, $help:literal) => {
        $crate::telemetry::__metrics::describe_histogram!(
            $name,
            $crate::telemetry::__metrics::Unit::$unit,
            $help
        )
    };
}
