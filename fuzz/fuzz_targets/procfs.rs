//! The host sensors' `/proc` text parsers (gma_sensors): every public `parse_*` on the same
//! input. They read kernel-written files, so this is hardening rather than an attack surface.
//!
//! Input: lossy UTF-8 text (raw bytes for `parse_auxv_clock_ticks`). Oracle: never panics.
//! Not reachable: the proc-connector datagram parser (`process::connector::parse_datagram`)
//! is private to its module.
#![no_main]

use gma_fuzz::MAX_INPUT;
use gma_sensors::{agent, cpu, disk, info, mem, net, process, tcp};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() > MAX_INPUT {
        return;
    }
    let text = String::from_utf8_lossy(data);
    let t = text.as_ref();
    let _ = cpu::parse_proc_stat(t);
    let _ = cpu::parse_loadavg(t);
    let _ = mem::parse_meminfo(t);
    let _ = net::parse_net_dev(t);
    let _ = disk::parse_diskstats(t);
    let _ = tcp::parse_snmp_tcp(t);
    let _ = info::parse_stat_info(t);
    let _ = info::parse_os_release(t);
    let _ = process::parse_stat(t);
    let _ = process::parse_statm(t);
    let _ = agent::parse_self_stat(t);
    let _ = agent::parse_vm_rss_kb(t);
    let _ = agent::parse_statm_rss_pages(t);
    let _ = agent::parse_auxv_clock_ticks(data);
});
