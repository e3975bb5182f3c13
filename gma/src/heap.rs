//! The process's heap as jemalloc (the `gma` binary's allocator with `--features jemalloc`) counts it,
//! exported with the other metrics at each scrape: what the program holds (`allocated`) next
//! to what the allocator keeps resident for it (`resident`), so a growing RSS can be told apart
//! as live data or as the allocator's own keeping (docs/archiver.md, "Memory, term by term").

use tikv_jemalloc_ctl::{epoch, stats};

/// The gauges, prefix `gma_process_heap_`.
const GAUGES: &[(&str, &str)] = &[
    (
        "gma_process_heap_allocated_bytes",
        "bytes the program holds allocated (jemalloc stats.allocated)",
    ),
    (
        "gma_process_heap_active_bytes",
        "bytes of the pages holding allocations (stats.active)",
    ),
    (
        "gma_process_heap_resident_bytes",
        "bytes the allocator keeps resident, metadata included (stats.resident)",
    ),
    (
        "gma_process_heap_retained_bytes",
        "bytes of virtual memory kept mapped but returned to the system (stats.retained)",
    ),
    (
        "gma_process_heap_metadata_bytes",
        "bytes of the allocator's own metadata (stats.metadata)",
    ),
];

/// Describes the gauges (once, with the recorder).
pub fn describe() {
    for (name, help) in GAUGES {
        metrics::describe_gauge!(*name, metrics::Unit::Bytes, *help);
    }
}

/// The allocator's figures now, in the order of `GAUGES`; `None` when it cannot tell (a build
/// whose allocator is not jemalloc reads zeros, not an error).
pub fn figures() -> Option<[u64; 5]> {
    epoch::advance().ok()?;
    Some([
        stats::allocated::read().ok()? as u64,
        stats::active::read().ok()? as u64,
        stats::resident::read().ok()? as u64,
        stats::retained::read().ok()? as u64,
        stats::metadata::read().ok()? as u64,
    ])
}

/// Sets the gauges to the allocator's figures now (before a scrape renders them).
pub fn record() {
    if let Some(f) = figures() {
        for ((name, _), v) in GAUGES.iter().zip(f) {
            metrics::gauge!(*name).set(v as f64);
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn figures_are_read() {
        // The test binary's allocator is the system's: jemalloc is linked but idle, so its
        // figures are read (no error), whatever they are.
        assert!(super::figures().is_some());
    }
}
