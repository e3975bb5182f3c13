//! The kernel's floor for a 1 -> N fan-out over loopback TCP: one writer process writes
//! `--chunk`-byte buffers round-robin to `--conns` connections held by `--readers` reader
//! processes (a thread per connection, blocking reads of 256 KiB), for `--seconds`. No
//! framing, no parsing, no allocation per write: what is left is the syscalls and the kernel's
//! copies and TCP work, i.e. what any user-space stream over TCP pays at least for the same
//! bytes. Prints the bytes moved, each process's CPU seconds (user, system, from
//! /proc/self/stat) and the CPU-seconds per GB over all processes, and beside them the CPU of
//! the kernel's ksoftirqd threads in the window (machine-wide).
//!
//! std only (no crate of ours used); an example of gma-bench so that the suite builds and lints it:
//!   cargo build --release -p gma-bench --example tcp_floor
//!   target/release/examples/tcp_floor --conns 100 --readers 4 --chunk 27000 --seconds 5

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// (user, system) CPU seconds of this process, all its threads (clock ticks of 10 ms).
fn cpu() -> (f64, f64) {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = after.split_whitespace().collect();
    let tick = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(f64::NAN) / 100.0;
    // Fields 14 and 15 of stat; `after` starts at field 3.
    (tick(11), tick(12))
}

/// CPU seconds of the kernel's softirq threads (`ksoftirqd/N`): loopback receive work the
/// kernel defers to them is charged to no process of the run. Machine-wide: on a shared
/// machine other processes' network work lands here too.
fn softirq_threads() -> f64 {
    let mut total = 0.0;
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let p = e.path();
        let comm = std::fs::read_to_string(p.join("comm")).unwrap_or_default();
        if !comm.starts_with("ksoftirqd") {
            continue;
        }
        let stat = std::fs::read_to_string(p.join("stat")).unwrap_or_default();
        let after = stat.rsplit_once(')').map_or("", |(_, r)| r);
        let f: Vec<f64> = after.split_whitespace().filter_map(|v| v.parse().ok()).collect();
        total += (f.get(10).copied().unwrap_or(0.0) + f.get(11).copied().unwrap_or(0.0)) / 100.0;
    }
    total
}

fn arg(args: &[String], name: &str, default: usize) -> usize {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn reader(addr: &str, conns: usize) -> std::io::Result<()> {
    let mut threads = Vec::new();
    for _ in 0..conns {
        let mut s = TcpStream::connect(addr)?;
        s.set_nodelay(true)?;
        threads.push(std::thread::spawn(move || {
            let mut buf = vec![0u8; 256 * 1024];
            let mut total = 0u64;
            while let Ok(n) = s.read(&mut buf) {
                if n == 0 {
                    break;
                }
                total += n as u64;
            }
            total
        }));
    }
    println!("connected");
    let total: u64 = threads.into_iter().map(|t| t.join().unwrap_or(0)).sum();
    let (u, s) = cpu();
    println!("{total} {u} {s}");
    Ok(())
}

fn main() -> std::io::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("reader") {
        let addr = args.get(2).cloned().unwrap_or_default();
        return reader(&addr, arg(&args, "--conns", 1));
    }
    let conns = arg(&args, "--conns", 100);
    let readers = arg(&args, "--readers", 4).clamp(1, conns);
    let chunk = arg(&args, "--chunk", 27_000);
    let seconds = arg(&args, "--seconds", 5) as u64;
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?.to_string();
    let me = std::env::current_exe()?;
    let mut children = Vec::new();
    for k in 0..readers {
        let n = conns / readers + usize::from(k < conns % readers);
        let mut c = Command::new(&me)
            .args(["reader", &addr, "--conns", &n.to_string()])
            .stdout(Stdio::piped())
            .spawn()?;
        let mut out = BufReader::new(c.stdout.take().ok_or(std::io::ErrorKind::BrokenPipe)?);
        let mut line = String::new();
        out.read_line(&mut line)?;
        children.push((c, out));
    }
    let mut socks = Vec::new();
    for _ in 0..conns {
        let (s, _) = listener.accept()?;
        s.set_nodelay(true)?;
        socks.push(s);
    }
    let buf = vec![7u8; chunk];
    let (u0, s0) = cpu();
    let k0 = softirq_threads();
    let t0 = Instant::now();
    let mut written = 0u64;
    'run: loop {
        for s in socks.iter_mut() {
            s.write_all(&buf)?;
            written += chunk as u64;
        }
        if t0.elapsed() >= Duration::from_secs(seconds) {
            break 'run;
        }
    }
    let wall = t0.elapsed().as_secs_f64();
    let (u1, s1) = cpu();
    let k1 = softirq_threads();
    drop(socks);
    let (mut read, mut ru, mut rs) = (0u64, 0.0, 0.0);
    for (mut c, mut out) in children {
        let mut line = String::new();
        out.read_line(&mut line)?;
        let f: Vec<f64> = line.split_whitespace().filter_map(|v| v.parse().ok()).collect();
        read += f.first().copied().unwrap_or(0.0) as u64;
        ru += f.get(1).copied().unwrap_or(f64::NAN);
        rs += f.get(2).copied().unwrap_or(f64::NAN);
        c.wait()?;
    }
    let gb = written as f64 / 1e9;
    let (wu, ws) = (u1 - u0, s1 - s0);
    let all = wu + ws + ru + rs;
    println!(
        "conns {conns} readers {readers} chunk {chunk} B: {gb:.2} GB written in {wall:.2} s ({:.2} GB/s), {read} B read",
        gb / wall
    );
    println!("  writer   user {wu:.2} s  sys {ws:.2} s");
    println!("  readers  user {ru:.2} s  sys {rs:.2} s (whole run, incl. connect)");
    println!("  ksoftirqd {:.2} s (machine-wide, not in `all`)", k1 - k0);
    println!(
        "  all      {all:.2} CPU-s = {:.3} CPU-s per GB; {:.2} cores",
        all / gb,
        all / wall
    );
    Ok(())
}
