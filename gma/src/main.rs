//! `gma`: the one operator binary; everything is in the library (src/lib.rs).

/// With the `jemalloc` feature, jemalloc instead of glibc malloc for every role: to compare the
/// two on the archiver's RSS over a soak (docs/PERFORMANCE.md, "Memory over time, soaks and
/// plots"; not yet measured side by side).
/// Its statistics are exported as `gma_process_heap_*` (src/heap.rs). Built without the
/// `jemalloc` feature, the binary keeps the system allocator (the gauges then read zeros).
#[cfg(feature = "jemalloc")]
#[global_allocator]
static ALLOC: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() {
    gma::main()
}
