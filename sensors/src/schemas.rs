//! The schemas (version 1) of every event the built-in sensors and the simulator emit.
//!
//! Field order is the contract: an [`crate::EventData`] carries the double fields in `numbers`
//! and the string fields in `strings`, each in the order listed here. Units follow the field
//! name suffix: `_mb` is MiB, `_per_s` is per second, `_pct` and the CPU states are percent.

use gma_core::event::{dbl, schema, text};
use gma_proto::v1::EventSchema;

pub const HOST_CPU: &str = "host.cpu";
pub const HOST_MEM: &str = "host.mem";
pub const HOST_NET: &str = "host.net";
pub const HOST_DISK: &str = "host.disk";
pub const NET_TCP: &str = "net.tcp";
pub const HOST_INFO: &str = "host.info";
pub const HOST_LOAD: &str = "host.load";
pub const GMA_AGENT: &str = "gma.agent";
pub const BATCH_QUEUE: &str = "batch.queue";
pub const HOST_BENCH: &str = "host.bench";
pub const HOST_AUTH: &str = "host.auth";

/// The version of every built-in schema but `host.info` ([`HOST_INFO_VERSION`]).
pub const VERSION: u32 = gma_core::event::SCHEMA_VERSION;

/// `host.cpu` (source = host): CPU time split over the last period, and the load averages.
pub fn host_cpu() -> EventSchema {
    schema(
        HOST_CPU,
        "CPU time by state over the last period (from /proc/stat deltas) and load averages",
        vec![
            dbl(
                "user",
                "%",
                "time running user code (guest time included), percent of all CPU time",
            ),
            dbl(
                "nice",
                "%",
                "time running niced user code, percent of all CPU time",
            ),
            dbl("system", "%", "time running kernel code, percent of all CPU time"),
            dbl(
                "idle",
                "%",
                "idle time with no I/O outstanding, percent of all CPU time",
            ),
            dbl(
                "iowait",
                "%",
                "idle time while I/O was outstanding, percent of all CPU time",
            ),
            dbl(
                "irq",
                "%",
                "time servicing hardware interrupts, percent of all CPU time",
            ),
            dbl(
                "softirq",
                "%",
                "time servicing software interrupts, percent of all CPU time",
            ),
            dbl(
                "steal",
                "%",
                "time stolen by the hypervisor for other guests, percent of all CPU time",
            ),
            dbl("load1", "tasks", "load average over 1 minute"),
            dbl("load5", "tasks", "load average over 5 minutes"),
            dbl("load15", "tasks", "load average over 15 minutes"),
            dbl(
                "running",
                "tasks",
                "runnable tasks right now (including the reader)",
            ),
            dbl("procs", "tasks", "tasks (processes and threads) that exist"),
        ],
    )
}

/// `host.mem` (source = host): memory and swap from /proc/meminfo.
pub fn host_mem() -> EventSchema {
    schema(
        HOST_MEM,
        "memory and swap use (from /proc/meminfo)",
        vec![
            dbl("total_mb", "MiB", "usable physical memory"),
            dbl("free_mb", "MiB", "memory not used for anything"),
            dbl(
                "available_mb",
                "MiB",
                "memory available to new work without swapping (MemAvailable)",
            ),
            dbl("buffers_mb", "MiB", "memory in block-device buffers"),
            dbl("cached_mb", "MiB", "memory in the page cache"),
            dbl("swap_total_mb", "MiB", "swap space configured"),
            dbl("swap_free_mb", "MiB", "swap space unused"),
            dbl(
                "used_pct",
                "%",
                "memory not available, percent of total: (total - available) / total",
            ),
        ],
    )
}

/// `host.net` (source = `<host>/<iface>`): one event per interface, loopback included.
pub fn host_net() -> EventSchema {
    schema(
        HOST_NET,
        "network interface traffic over the last period (from /proc/net/dev deltas)",
        vec![
            dbl("rx_bytes_per_s", "B/s", "bytes received per second"),
            dbl("tx_bytes_per_s", "B/s", "bytes sent per second"),
            dbl("rx_packets_per_s", "packets/s", "packets received per second"),
            dbl("tx_packets_per_s", "packets/s", "packets sent per second"),
            dbl("rx_errors_per_s", "errors/s", "receive errors per second"),
            dbl("tx_errors_per_s", "errors/s", "transmit errors per second"),
            text("iface", "interface name"),
        ],
    )
}

/// `host.disk` (source = `<host>/<device>`): one event per whole block device.
pub fn host_disk() -> EventSchema {
    schema(
        HOST_DISK,
        "block device I/O over the last period (from /proc/diskstats deltas; whole devices only)",
        vec![
            dbl("reads_per_s", "ops/s", "reads completed per second"),
            dbl("writes_per_s", "ops/s", "writes completed per second"),
            dbl("read_bytes_per_s", "B/s", "bytes read per second (sectors * 512)"),
            dbl(
                "written_bytes_per_s",
                "B/s",
                "bytes written per second (sectors * 512)",
            ),
            dbl(
                "io_ms_per_s",
                "ms/s",
                "milliseconds spent doing I/O per second (1000 = saturated)",
            ),
            text("device", "block device name as in /proc/diskstats"),
        ],
    )
}

/// `net.tcp` (source = host): TCP counters from /proc/net/snmp.
pub fn net_tcp() -> EventSchema {
    schema(
        NET_TCP,
        "TCP activity over the last period (from the Tcp: lines of /proc/net/snmp)",
        vec![
            dbl(
                "retrans_segs_per_s",
                "segments/s",
                "segments retransmitted per second",
            ),
            dbl(
                "out_segs_per_s",
                "segments/s",
                "segments sent per second (retransmissions excluded)",
            ),
            dbl(
                "in_errs_per_s",
                "segments/s",
                "segments received in error per second",
            ),
            dbl(
                "retrans_pct",
                "%",
                "retransmitted segments as a percent of segments sent",
            ),
            dbl(
                "active_opens_per_s",
                "opens/s",
                "connections opened by this host per second",
            ),
            dbl(
                "curr_estab",
                "connections",
                "connections currently established or closing",
            ),
        ],
    )
}

/// The version of `host.info`: 2 is version 1 with `os_id`, `os_version`, `disk_free_mb`,
/// `mounts` and `software` appended (a reader of version 1's fields, by name or by position
/// among the numbers and among the strings, reads them unchanged). A new version because the
/// directory refuses a changed definition under an existing one.
pub const HOST_INFO_VERSION: u32 = 2;

/// `host.info` (source = host): slowly changing facts, sent at start and every info period.
pub fn host_info() -> EventSchema {
    let mut s =
        schema(
            HOST_INFO,
            "host description: operating system, kernel, architecture, size, free disk, installed software",
            vec![
            text("os", "operating system (PRETTY_NAME of os-release)"),
            text("kernel", "kernel release"),
            text("arch", "CPU architecture"),
            text("hostname", "kernel host name"),
            dbl("cores", "cpus", "online logical CPUs"),
            dbl("memory_mb", "MiB", "usable physical memory"),
            dbl(
                "boot_time_s",
                "s",
                "boot time, seconds since the Unix epoch (UTC)",
            ),
            // Appended fields (older consumers read the ones above unchanged).
            text("os_id", "operating system id (ID of os-release: debian, ubuntu, rhel...)"),
            text("os_version", "operating system version (VERSION_ID of os-release; empty when none)"),
            dbl(
                "disk_free_mb",
                "MiB",
                "space available to unprivileged users on the root filesystem (NaN when unknown)",
            ),
            text(
                "mounts",
                "storage mounts as <mount>=<available MiB>/<size MiB> joined by ',' (df -P -k; at most 32)",
            ),
            text(
                "software",
                "installed packages of the configured list as name=version joined by ',' (dpkg-query)",
            ),
        ],
        );
    s.version = HOST_INFO_VERSION;
    s
}

/// `host.load` (source = host): what a broker needs to place work.
pub fn host_load() -> EventSchema {
    schema(
        HOST_LOAD,
        "capacity summary for brokering: load, free CPUs, queue, memory, benchmarks",
        vec![
            dbl("load1", "tasks", "load average over 1 minute"),
            dbl(
                "free_cpus",
                "cpus",
                "CPUs free for new work: max(0, total_cpus - load1) rounded down",
            ),
            dbl("total_cpus", "cpus", "logical CPUs"),
            dbl(
                "queue_waiting",
                "jobs",
                // Worded as registered in version 1 (a changed description is a changed
                // definition to the directory). On a real host it is the batch system's
                // pending jobs (`batch.queue`), 0 without one.
                "jobs waiting in the local queue (0 on a real host)",
            ),
            dbl("memory_mb", "MiB", "usable physical memory"),
            dbl(
                "bench_specint",
                "score",
                "SPECint-style integer benchmark score (NaN when unknown)",
            ),
            dbl(
                "bench_specfp",
                "score",
                "SPECfp-style floating-point benchmark score (NaN when unknown)",
            ),
        ],
    )
}

/// `host.auth` (source = host): one authentication, session or privilege record of the host's
/// auth log or journal (see [`crate::auth`]); nothing secret.
pub fn host_auth() -> EventSchema {
    schema(
        HOST_AUTH,
        "a login, logout, authentication, sudo or password change on the host (auth log or journal)",
        vec![
            text(
                "kind",
                "auth_success, auth_failure, login, logout, sudo or password_change",
            ),
            text("user", "the user it concerns (for sudo: who ran it)"),
            text(
                "service",
                "sshd, sudo, su, login, passwd, ... (PAM service or program)",
            ),
            text("remote", "the remote address (\"\" when local)"),
            text(
                "detail",
                "the auth method (sshd), or the target user and program of sudo (never its arguments)",
            ),
        ],
    )
}

/// `batch.queue` (source = `<host>/<partition>`): one event per batch partition or queue.
pub fn batch_queue() -> EventSchema {
    schema(
        BATCH_QUEUE,
        "the local batch system's queue, per partition (Slurm: squeue and sinfo)",
        vec![
            dbl("jobs_pending", "jobs", "jobs waiting to start in the partition"),
            dbl("jobs_running", "jobs", "jobs running in the partition"),
            dbl("nodes_total", "nodes", "nodes of the partition"),
            dbl("nodes_idle", "nodes", "nodes with nothing allocated"),
            dbl("nodes_busy", "nodes", "nodes allocated, mixed or completing"),
            dbl("nodes_down", "nodes", "nodes down, drained, draining or failing"),
            dbl("cpus_total", "cpus", "CPUs of the partition's nodes"),
            dbl("cpus_idle", "cpus", "CPUs idle (not allocated, not down)"),
            dbl(
                "backfill_window_s",
                "s",
                "how long the idle CPUs stay free for a job starting now: until the earliest \
                 expected start of a pending job, else the time limit (0 = no idle CPU, NaN = unbounded)",
            ),
            text("partition", "partition (queue) name"),
            text("system", "batch system: slurm"),
            text("state", "partition availability: up, down, drain, inact"),
        ],
    )
}

/// `host.bench` (source = host): the agent's benchmark run (sensors/src/bench.rs).
pub fn host_bench() -> EventSchema {
    schema(
        HOST_BENCH,
        "a short CPU and memory benchmark of one thread, on the broker's reference scale (1000 = the reference machine)",
        vec![
            dbl("specint", "score", "integer throughput, 1000 = the reference machine"),
            dbl("specfp", "score", "floating-point throughput, 1000 = the reference machine"),
            dbl("mem_mbps", "MB/s", "memory copy bandwidth, bytes read plus written"),
            dbl("duration_s", "s", "how long the run took"),
        ],
    )
}

/// `gma.agent` (source = the agent's host): what running the producer costs.
pub fn gma_agent() -> EventSchema {
    schema(
        GMA_AGENT,
        "the monitoring agent's own cost (from /proc/self)",
        vec![
            dbl(
                "cpu_pct",
                "%",
                "CPU used by the agent over the last period, percent of one core",
            ),
            dbl("rss_mb", "MiB", "resident memory of the agent"),
            dbl("values_per_s", "values/s", "sensor values sampled per second"),
            dbl("events_per_s", "events/s", "events sampled per second"),
            dbl("threads", "threads", "threads of the agent process"),
        ],
    )
}

/// Every schema of this crate: the host sensors, the agent sensor and the simulator.
pub fn builtin_schemas() -> Vec<EventSchema> {
    vec![
        host_cpu(),
        host_mem(),
        host_net(),
        host_disk(),
        net_tcp(),
        host_info(),
        host_load(),
        gma_agent(),
        batch_queue(),
        host_bench(),
        host_auth(),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use gma_core::event::validate_schema;

    #[test]
    fn every_schema_is_valid_and_documented() {
        let all = builtin_schemas();
        let mut names: Vec<&str> = all.iter().map(|s| s.name.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), all.len(), "duplicate schema names");
        for s in &all {
            validate_schema(s).unwrap_or_else(|e| panic!("{}: {e}", s.name));
            assert!(!s.description.is_empty(), "{}", s.name);
            for f in &s.fields {
                assert!(
                    !f.description.is_empty(),
                    "{}.{} has no description",
                    s.name,
                    f.name
                );
            }
        }
    }

    /// The wire contract: field names, types and units, in order.
    #[test]
    fn builtin_schemas_are_pinned() {
        assert_eq!(
            gma_core::event::signature(&builtin_schemas()[0]),
            "host.cpu v1: user double %, nice double %, system double %, idle double %, iowait double %, irq double %, softirq double %, steal double %, load1 double tasks, load5 double tasks, load15 double tasks, running double tasks, procs double tasks"
        );
        assert_eq!(
            gma_core::event::signature(&builtin_schemas()[1]),
            "host.mem v1: total_mb double MiB, free_mb double MiB, available_mb double MiB, buffers_mb double MiB, cached_mb double MiB, swap_total_mb double MiB, swap_free_mb double MiB, used_pct double %"
        );
        assert_eq!(
            gma_core::event::signature(&builtin_schemas()[2]),
            "host.net v1: rx_bytes_per_s double B/s, tx_bytes_per_s double B/s, rx_packets_per_s double packets/s, tx_packets_per_s double packets/s, rx_errors_per_s double errors/s, tx_errors_per_s double errors/s, iface string"
        );
        assert_eq!(
            gma_core::event::signature(&builtin_schemas()[3]),
            "host.disk v1: reads_per_s double ops/s, writes_per_s double ops/s, read_bytes_per_s double B/s, written_bytes_per_s double B/s, io_ms_per_s double ms/s, device string"
        );
        assert_eq!(
            gma_core::event::signature(&builtin_schemas()[4]),
            "net.tcp v1: retrans_segs_per_s double segments/s, out_segs_per_s double segments/s, in_errs_per_s double segments/s, retrans_pct double %, active_opens_per_s double opens/s, curr_estab double connections"
        );
        assert_eq!(
            gma_core::event::signature(&builtin_schemas()[5]),
            "host.info v2: os string, kernel string, arch string, hostname string, cores double cpus, memory_mb double MiB, boot_time_s double s, os_id string, os_version string, disk_free_mb double MiB, mounts string, software string"
        );
        assert_eq!(
            gma_core::event::signature(&builtin_schemas()[6]),
            "host.load v1: load1 double tasks, free_cpus double cpus, total_cpus double cpus, queue_waiting double jobs, memory_mb double MiB, bench_specint double score, bench_specfp double score"
        );
        assert_eq!(
            gma_core::event::signature(&builtin_schemas()[7]),
            "gma.agent v1: cpu_pct double %, rss_mb double MiB, values_per_s double values/s, events_per_s double events/s, threads double threads"
        );
        assert_eq!(
            gma_core::event::signature(&builtin_schemas()[8]),
            "batch.queue v1: jobs_pending double jobs, jobs_running double jobs, nodes_total double nodes, nodes_idle double nodes, nodes_busy double nodes, nodes_down double nodes, cpus_total double cpus, cpus_idle double cpus, backfill_window_s double s, partition string, system string, state string"
        );
        assert_eq!(
            gma_core::event::signature(&builtin_schemas()[9]),
            "host.bench v1: specint double score, specfp double score, mem_mbps double MB/s, duration_s double s"
        );
        assert_eq!(
            gma_core::event::signature(&builtin_schemas()[10]),
            "host.auth v1: kind string, user string, service string, remote string, detail string"
        );
    }
}
