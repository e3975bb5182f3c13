//! `gma bench nats`: NATS beside the cross-process `stream` — a `nats-server` process (Debian's
//! nats-server on the PATH), a subscriber process holding `--subscribers` subscriptions (each
//! its own connection; `gma bench nats-sub`, hidden) and this process publishing back to back
//! on one connection (pipelined `PUB`s of `--payload` bytes, the first 8 a sequence number).
//!
//! Like for like: the payload defaults to 27 bytes, what one 3-value event of `stream` costs on
//! the consumer's socket (27.1 measured with all of gRPC's and HTTP/2's framing; NATS adds its
//! `MSG` line on top of the payload, counted here as socket bytes per message). Placement: the
//! NATS publisher is a client process of the server, one loopback hop before the server; the
//! `stream` generator runs inside the producer process (no such hop), and `stream --source
//! ingest` is the placement NATS has (the publisher a process of its own, pushing over
//! loopback). NATS has no resume and reports no gaps: loss is what the subscriber's sequence
//! numbers show missing. The window is taken as `stream` takes it (a `start`/`stop` line to
//! the subscriber process, /proc sampled at both ends).

use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::args::Output;
use crate::child::wait_line;
use crate::report::{emit, proc_usage};
use crate::wire::{follow_window, tell, Proc, AFTER, BEFORE, COUNTING};

const SUBJECT: &str = "bench.x";

async fn connect(port: u16) -> anyhow::Result<TcpStream> {
    let mut s = TcpStream::connect(("127.0.0.1", port))
        .await
        .with_context(|| format!("cannot connect to nats-server on port {port}"))?;
    s.set_nodelay(true)?;
    s.write_all(b"CONNECT {\"verbose\":false,\"pedantic\":false}\r\n")
        .await?;
    Ok(s)
}

/// What one subscription counted.
#[derive(Default, Clone, Copy)]
struct Count {
    received: u64,
    window: u64,
    /// Bytes read from the server within the window (everything on the subscriber's socket).
    window_bytes: u64,
    missing: u64,
    next: Option<u64>,
    /// The server closed the connection (NATS closes a slow consumer's).
    closed: bool,
}

/// `gma bench nats-sub`: `subscribers` connections subscribed to the bench subject; `ready`,
/// then counting between `start` and `stop` on stdin, then one JSON line.
pub async fn sub(port: u16, subscribers: usize) -> anyhow::Result<()> {
    let (state_tx, state_rx) = tokio::sync::watch::channel(BEFORE);
    let mut tasks = Vec::new();
    for i in 0..subscribers {
        let mut s = connect(port).await?;
        s.write_all(format!("SUB {SUBJECT} {i}\r\nPING\r\n").as_bytes())
            .await?;
        let mut state = state_rx.clone();
        tasks.push(tokio::spawn(async move {
            let mut c = Count::default();
            let mut buf: Vec<u8> = Vec::with_capacity(1 << 20);
            let mut chunk = vec![0u8; 1 << 18];
            loop {
                let st = *state.borrow_and_update();
                if st == AFTER {
                    break;
                }
                let n = tokio::select! {
                    _ = state.changed() => continue,
                    n = s.read(&mut chunk) => n?,
                };
                if n == 0 {
                    c.closed = true;
                    break;
                }
                if st == COUNTING {
                    c.window_bytes += n as u64;
                }
                buf.extend_from_slice(&chunk[..n]);
                let mut at = 0;
                while let Some(end) = buf[at..].windows(2).position(|w| w == b"\r\n") {
                    let line = &buf[at..at + end];
                    if let Some(rest) = line.strip_prefix(b"MSG ") {
                        let len: usize = std::str::from_utf8(rest)
                            .ok()
                            .and_then(|r| r.rsplit(' ').next())
                            .and_then(|l| l.parse().ok())
                            .ok_or_else(|| anyhow!("bad MSG line"))?;
                        let start = at + end + 2;
                        if buf.len() < start + len + 2 {
                            break;
                        }
                        let seq = buf
                            .get(start..start + 8)
                            .and_then(|b| b.try_into().ok())
                            .map(u64::from_le_bytes)
                            .unwrap_or(0);
                        if let Some(next) = c.next {
                            c.missing += seq.saturating_sub(next);
                        }
                        c.next = Some(seq + 1);
                        c.received += 1;
                        if st == COUNTING {
                            c.window += 1;
                        }
                        at = start + len + 2;
                    } else {
                        if line == b"PING" {
                            s.write_all(b"PONG\r\n").await?;
                        }
                        at += end + 2;
                    }
                }
                buf.drain(..at);
            }
            anyhow::Ok(c)
        }));
    }
    println!("ready");
    follow_window(&state_tx).await;
    let mut subs = Vec::new();
    for t in tasks {
        let c = tokio::time::timeout(Duration::from_secs(5), t)
            .await
            .context("a subscription did not stop within 5 s")?
            .context("subscription task")??;
        subs.push(
            serde_json::json!({"received": c.received, "window_events": c.window, "window_bytes": c.window_bytes, "missing": c.missing, "closed_by_server": c.closed}),
        );
    }
    println!("{}", serde_json::json!({ "subscriptions": subs }));
    Ok(())
}

pub async fn run(duration: u64, subscribers: usize, payload: usize, output: Output) -> anyhow::Result<()> {
    if duration == 0 || subscribers == 0 || payload < 8 {
        bail!("--duration and --subscribers must be positive and --payload at least 8 bytes");
    }
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0")?;
        l.local_addr()?.port()
    };
    let mut server = tokio::process::Command::new("nats-server")
        .args(["-a", "127.0.0.1", "-p", &port.to_string()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .context("cannot start nats-server: install it (Debian: apt-get install nats-server)")?;
    let server_pid = server
        .id()
        .ok_or_else(|| anyhow!("nats-server exited at once"))?
        .to_string();
    let deadline = Instant::now() + Duration::from_secs(20);
    while TcpStream::connect(("127.0.0.1", port)).await.is_err() {
        if Instant::now() > deadline {
            bail!("nats-server did not listen on port {port} within 20 s");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut subp = Proc::spawn(
        &format!("gma bench nats-sub ({subscribers} subscriptions)"),
        &[
            "bench".into(),
            "nats-sub".into(),
            "--port".into(),
            port.to_string(),
            "--subscribers".into(),
            subscribers.to_string(),
        ],
        true,
    )?;
    let mut out =
        tokio::io::BufReader::new(subp.child.stdout.take().ok_or_else(|| anyhow!("no stdout"))?).lines();
    let mut stdin = subp.child.stdin.take().ok_or_else(|| anyhow!("no stdin"))?;
    wait_line(&mut out, "ready", &subp.name, Duration::from_secs(30)).await?;
    // Let the subscriptions reach the server (a PING each was sent after its SUB).
    tokio::time::sleep(Duration::from_millis(500)).await;

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let publisher = tokio::spawn(async move {
        let mut s = connect(port).await?;
        let header = format!("PUB {SUBJECT} {payload}\r\n");
        let mut buf = Vec::with_capacity(1 << 20);
        let mut seq = 0u64;
        while !*stop_rx.borrow() {
            buf.clear();
            for _ in 0..2000 {
                buf.extend_from_slice(header.as_bytes());
                buf.extend_from_slice(&seq.to_le_bytes());
                buf.resize(buf.len() + payload - 8, b'x');
                buf.extend_from_slice(b"\r\n");
                seq += 1;
            }
            s.write_all(&buf).await?;
        }
        anyhow::Ok(seq)
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    let me = std::process::id().to_string();
    let cpu = |pid: &str| proc_usage(pid).map(|u| u.0).unwrap_or(f64::NAN);
    let t0 = Instant::now();
    let c0 = [cpu(&server_pid), cpu(&subp.pid), cpu(&me)];
    tell(&mut stdin, "start").await?;
    tokio::time::sleep(Duration::from_secs(duration)).await;
    let c1 = [cpu(&server_pid), cpu(&subp.pid), cpu(&me)];
    let rss = [proc_usage(&server_pid), proc_usage(&subp.pid), proc_usage(&me)]
        .map(|u| u.map(|u| u.1).unwrap_or(f64::NAN));
    let seconds = t0.elapsed().as_secs_f64();
    tell(&mut stdin, "stop").await?;
    let json = format!(
        "{{{}",
        wait_line(&mut out, "{", &subp.name, Duration::from_secs(30)).await?
    );
    let v: serde_json::Value = serde_json::from_str(&json).context("bad JSON from nats-sub")?;
    let _ = stop_tx.send(true);
    let published = publisher.await.context("publisher")??;
    let _ = server.kill().await;
    let subs = v["subscriptions"].as_array().cloned().unwrap_or_default();
    let sum = |k: &str| subs.iter().map(|s| s[k].as_u64().unwrap_or(0)).sum::<u64>();
    let window = sum("window_events");
    let window_bytes = sum("window_bytes");
    let min = subs
        .iter()
        .map(|s| s["window_events"].as_u64().unwrap_or(0))
        .min()
        .unwrap_or(0);
    let names = ["nats-server", subp.name.as_str(), "gma bench (publisher)"];
    let processes: Vec<serde_json::Value> = (0..3)
        .map(|i| serde_json::json!({"name": names[i], "cpu_seconds": c1[i] - c0[i], "cores": (c1[i] - c0[i]) / seconds, "rss_mib_end": rss[i]}))
        .collect();
    let fig = serde_json::json!({
        "scenario": "nats",
        "subscribers": subscribers,
        "payload_bytes": payload,
        "publisher": "a client process of nats-server (this process), one loopback hop before the server",
        "socket_bytes": window_bytes,
        "socket_bytes_per_message": window_bytes as f64 / window.max(1) as f64,
        "seconds": seconds,
        "published_total": published,
        "window_events": window,
        "events_per_s": window as f64 / seconds,
        "per_subscriber_events_per_s": window as f64 / seconds / subscribers as f64,
        "min_subscriber_events_per_s": min as f64 / seconds,
        "received": sum("received"),
        "missing": sum("missing"),
        "closed_by_server": subs.iter().filter(|s| s["closed_by_server"] == true).count(),
        "subscriptions": subs,
        "processes": processes,
    });
    match output {
        Output::Json => emit(fig),
        Output::Table => {
            println!("nats: publisher (this process) -> nats-server -> {subscribers} subscriptions in one process, {payload}-byte payloads, back to back");
            println!(
                "  delivered                {:.0} messages/s over {seconds:.1} s",
                window as f64 / seconds
            );
            println!(
                "  per subscription         {:.0} messages/s (slowest {:.0})",
                window as f64 / seconds / subscribers as f64,
                min as f64 / seconds
            );
            println!(
                "  on the socket            {:.1} bytes/message at the subscribers",
                fig["socket_bytes_per_message"].as_f64().unwrap_or(f64::NAN)
            );
            println!(
                "  missing (by seq)         {}; subscriptions closed by the server {}",
                sum("missing"),
                fig["closed_by_server"]
            );
            for p in &processes {
                println!(
                    "  {:<45} {:.2} cores, RSS {:.1} MiB",
                    p["name"].as_str().unwrap_or("?"),
                    p["cores"].as_f64().unwrap_or(f64::NAN),
                    p["rss_mib_end"].as_f64().unwrap_or(f64::NAN)
                );
            }
        }
    }
    Ok(())
}
