//! `gma`: the one operator binary; everything is in the library (src/lib.rs).

/// With the `jemalloc` feature (the default), jemalloc instead of glibc malloc for every role:
/// glibc kept the freed transient buffers of snapshots and checkpoints resident for good, as
/// steps of RSS (docs/PERFORMANCE.md, "Memory over time, soaks and plots").
/// Its statistics are exported as `gma_process_heap_*` (src/heap.rs). Built without the
/// `jemalloc` feature, the binary keeps the system allocator (the gauges then read zeros).
#[cfg(feature = "jemalloc")]
#[global_allocator]
static ALLOC: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() {
    #[cfg(feature = "jemalloc")]
    purge_in_the_background();
    gma::main()
}

/// Freed pages go back to the system after jemalloc's decay time (10 s) even in a process that
/// then allocates little (a directory member between snapshots): a background thread purges
/// them, where jemalloc would otherwise purge only on its next allocations. One such thread for
/// all arenas (jemalloc's default is up to one per core).
#[cfg(feature = "jemalloc")]
fn purge_in_the_background() {
    let one = tikv_jemalloc_ctl::max_background_threads::write(1);
    if let Err(e) = one.and_then(|()| tikv_jemalloc_ctl::background_thread::write(true)) {
        eprintln!("gma: jemalloc background purging not enabled ({e}); freed pages are returned on later allocations");
    }
}
