//! The SNMP device sensor against a real net-snmp agent on 127.0.0.1 (issue 24, item 3;
//! docs/snmp.md).
//!
//! The tolerance of the rate test is a correctness bound, not a timing one. The agent reads
//! the kernel's counters of `lo` when it answers (its interface cache is switched off), so the
//! counter a poll returns was the kernel's value at some instant while the request was in
//! flight: between the kernel's `rx_bytes` read just before the poll (`kb`) and just after it
//! (`ka`), counters being monotonic. Hence for two polls i-1 and i, the SNMP delta
//! `rate_i * dt_i` lies in `[kb_i - ka_(i-1), ka_i - kb_(i-1)]`: it may differ from the kernel's
//! delta `kb_i - kb_(i-1)` by at most the bytes the kernel counted while the two requests were
//! in flight, `(ka_i - kb_i) + (ka_(i-1) - kb_(i-1))` (the requests' own packets on `lo`
//! included). Any wrong counter, OID, unit or interval in the sensor breaks it.

#![allow(clippy::unwrap_used)]

use gma_tests as common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::snmpd;
use common::*;
use gma_sensors::snmp::{self as snmp, SnmpDevice, SnmpSensor};
use gma_sensors::{EventData, Sensor};

fn lo_counter(name: &str) -> u64 {
    std::fs::read_to_string(format!("/sys/class/net/lo/statistics/{name}"))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

fn now_ns() -> i64 {
    gma_core::time::now_ns()
}

/// UDP datagrams on `lo` until dropped, so the rates are far from zero.
struct Traffic {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Traffic {
    fn start() -> Traffic {
        let rx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        rx.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
        let to = rx.local_addr().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::spawn(move || {
            let tx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
            let buf = [0x5au8; 8192];
            let mut sink = [0u8; 65536];
            while !s.load(Ordering::Relaxed) {
                for _ in 0..16 {
                    let _ = tx.send_to(&buf, to);
                }
                while rx.recv(&mut sink).is_ok_and(|n| n > 0) {
                    if s.load(Ordering::Relaxed) {
                        break;
                    }
                    // drain what is queued, then send more
                    rx.set_nonblocking(true).unwrap();
                }
                rx.set_nonblocking(false).unwrap();
            }
        });
        Traffic {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Traffic {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn of<'a>(out: &'a [EventData], name: &str) -> Vec<&'a EventData> {
    out.iter().filter(|e| e.name == name).collect()
}

/// Kernel counters of `lo` read just before and just after one sensor sample.
struct Bracket {
    at_ns: i64,
    rx: (u64, u64),
    tx: (u64, u64),
}

fn bracketed(s: &mut SnmpSensor, out: &mut Vec<EventData>) -> Bracket {
    let (rx0, tx0) = (lo_counter("rx_bytes"), lo_counter("tx_bytes"));
    let at_ns = now_ns();
    s.sample(at_ns, out).unwrap();
    let (rx1, tx1) = (lo_counter("rx_bytes"), lo_counter("tx_bytes"));
    Bracket {
        at_ns,
        rx: (rx0, rx1),
        tx: (tx0, tx1),
    }
}

fn check_rates(label: &str, dev: SnmpDevice) {
    let mut s = SnmpSensor::new(Duration::from_secs(1), vec![dev]).unwrap();
    let mut out = Vec::new();
    let mut prev = bracketed(&mut s, &mut out);
    let dev_events = of(&out, snmp::NET_SNMP_DEVICE);
    assert_eq!(dev_events.len(), 1);
    assert_eq!(
        dev_events[0].strings[3], "ok",
        "{label}: first poll: {:?}",
        dev_events[0].strings
    );
    assert!(
        of(&out, snmp::NET_SNMP_IF).is_empty(),
        "the first poll is the baseline"
    );
    for round in 1..=3 {
        // Let traffic flow: at least 256 MiB through lo since the last poll, so the interval
        // is long beside the polls that bound it (the bound is then a few percent).
        let from = prev.rx.1;
        let enough = || lo_counter("rx_bytes") >= from + (256 << 20);
        assert!(wait_until(Duration::from_secs(60), enough), "no traffic on lo");
        out.clear();
        let cur = bracketed(&mut s, &mut out);
        let ifs = of(&out, snmp::NET_SNMP_IF);
        assert_eq!(ifs.len(), 1, "{label}: one net.snmp.if for lo: {out:?}");
        let e = ifs[0];
        assert_eq!(e.source, format!("{label}/lo"));
        assert_eq!(e.strings[1], "lo");
        let dt = (cur.at_ns - prev.at_ns) as f64 / 1e9;
        for (what, rate, k_prev, k_cur, counter) in [
            ("in", e.numbers[0], prev.rx, cur.rx, e.numbers[6]),
            ("out", e.numbers[1], prev.tx, cur.tx, e.numbers[7]),
        ] {
            let delta = (rate * dt).round();
            let (lo, hi) = ((k_cur.0 - k_prev.1) as f64, (k_cur.1 - k_prev.0) as f64);
            let kernel = (k_cur.0 - k_prev.0) as f64;
            let tolerance = hi - lo;
            println!(
                "{label} round {round} {what}: snmp {:.0} B/s, kernel {:.0} B/s over {dt:.3} s; \
                 snmp delta {delta} B, kernel delta {kernel} B, bound +-{tolerance} B ({:.3}%)",
                rate,
                kernel / dt,
                100.0 * tolerance / kernel
            );
            assert!(
                lo <= delta && delta <= hi,
                "{label} {what}: snmp delta {delta} B outside the kernel's [{lo}, {hi}] B"
            );
            assert!(
                (k_cur.0 as f64) <= counter && counter <= k_cur.1 as f64,
                "{label} {what}: counter {counter} outside the kernel's [{}, {}] at the poll",
                k_cur.0,
                k_cur.1
            );
            assert!(
                delta >= (256 << 20) as f64 - tolerance,
                "{label} {what}: the traffic is missing"
            );
        }
        assert_eq!(e.numbers[5], 1.0, "lo is up");
        prev = cur;
    }
}

#[test]
fn lo_rates_match_the_kernel_over_v2c_and_v3_auth_priv() {
    let Some(agent) = snmpd::snmpd_or_skip("lo_rates_match_the_kernel_over_v2c_and_v3_auth_priv") else {
        return;
    };
    agent.disable_if_cache().unwrap();
    let _traffic = Traffic::start();
    let only_lo = |mut d: SnmpDevice| {
        d.interfaces = vec!["lo".to_string()];
        d
    };
    check_rates(
        "v2c",
        only_lo(SnmpDevice::v2c("v2c", &agent.address(), snmpd::COMMUNITY)),
    );
    check_rates(
        "v3",
        only_lo(SnmpDevice::v3(
            "v3",
            &agent.address(),
            snmpd::V3_USER,
            snmpd::V3_AUTH,
            snmpd::V3_PRIV,
        )),
    );
}

#[test]
fn wrong_v3_credentials_and_a_down_agent_are_events_and_a_restart_is_detected() {
    let Some(mut agent) = snmpd::snmpd_or_skip("wrong_v3_credentials_and_a_down_agent_are_events") else {
        return;
    };
    let addr = agent.address();
    let wrong_pass = SnmpDevice::v3(
        "badpass",
        &addr,
        snmpd::V3_USER,
        "not-the-password",
        snmpd::V3_PRIV,
    );
    let wrong_user = SnmpDevice::v3("baduser", &addr, "nobody", snmpd::V3_AUTH, snmpd::V3_PRIV);
    let good = SnmpDevice {
        timeout_ms: 300,
        retries: 1,
        ..SnmpDevice::v2c("good", &addr, snmpd::COMMUNITY)
    };
    // A wrong community gets no answer (agents stay silent), like a device that never answers:
    // a UDP socket that holds its port and reads nothing.
    let silent = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let quick = |d: SnmpDevice| SnmpDevice {
        timeout_ms: 200,
        retries: 1,
        ..d
    };
    let wrong_community = quick(SnmpDevice::v2c("badcomm", &addr, "not-the-community"));
    let mute = quick(SnmpDevice::v2c(
        "silent",
        &silent.local_addr().unwrap().to_string(),
        snmpd::COMMUNITY,
    ));
    let mut s = SnmpSensor::new(
        Duration::from_secs(1),
        vec![wrong_pass, wrong_user, good, wrong_community, mute],
    )
    .unwrap();
    let mut out = Vec::new();
    s.sample(now_ns(), &mut out).unwrap();
    let state = |out: &[EventData], dev: &str| -> Vec<String> {
        of(out, snmp::NET_SNMP_DEVICE)
            .into_iter()
            .find(|e| e.source == dev)
            .map(|e| e.strings.clone())
            .unwrap_or_else(|| panic!("no net.snmp.device for {dev}: {out:?}"))
    };
    for dev in ["badpass", "baduser"] {
        let st = state(&out, dev);
        println!("{dev}: {st:?}");
        assert_eq!(st[3], "auth_failed", "{dev}: {st:?}");
        assert!(st[4].contains("authentication"), "{st:?}");
        assert!(!st[4].contains(snmpd::V3_AUTH) && !st[4].contains("not-the-password"));
    }
    assert_eq!(state(&out, "good")[3], "ok");
    for dev in ["badcomm", "silent"] {
        let st = state(&out, dev);
        println!("{dev}: {st:?}");
        assert_eq!(st[3], "unreachable", "{dev}: {st:?}");
        assert!(st[4].contains("no answer") && st[4].contains("2 tries"), "{st:?}");
        assert!(!st[4].contains("not-the-community"), "{st:?}");
    }
    drop(silent);

    // The agent has run a while (sysUpTime >= 3 s), so that a restart sets it back.
    assert!(
        wait_until(Duration::from_secs(30), || {
            let mut o = Vec::new();
            s.sample(now_ns(), &mut o).unwrap();
            of(&o, snmp::NET_SNMP_DEVICE)
                .iter()
                .any(|e| e.source == "good" && e.numbers[1] >= 3.0)
        }),
        "sysUpTime never reached 3 s"
    );
    agent.stop();
    out.clear();
    let t = std::time::Instant::now();
    s.sample(now_ns(), &mut out).unwrap();
    let took = t.elapsed();
    let st = state(&out, "good");
    println!("down: {st:?} after {took:?}");
    assert_eq!(st[3], "unreachable", "{st:?}");
    assert!(st[4].contains("no answer"), "{st:?}");
    agent.restart().unwrap();
    out.clear();
    s.sample(now_ns(), &mut out).unwrap();
    assert_eq!(state(&out, "good")[3], "ok");
    let restarts: Vec<_> = of(&out, snmp::NET_SNMP_CHANGE)
        .into_iter()
        .filter(|e| e.source == "good" && e.strings[1] == "restarted")
        .collect();
    assert_eq!(restarts.len(), 1, "one restarted event: {out:?}");
    assert!(
        of(&out, snmp::NET_SNMP_IF)
            .iter()
            .all(|e| !e.source.starts_with("good/")),
        "no rate across a restart: {out:?}"
    );
}

#[test]
fn a_producer_publishes_snmp_events_and_lists_its_devices_in_the_directory() {
    let Some(agent) = snmpd::snmpd_or_skip("a_producer_publishes_snmp_events") else {
        return;
    };
    let tmp = tempdir();
    let dir = Proc::directory(&tmp.path().join("dir"), "127.0.0.1:0");
    let daddr = dir.addr.clone();
    let cfg = tmp.path().join("producer.toml");
    std::fs::write(
        &cfg,
        format!(
            "snmp_period_ms = 200\n\
             [[snmp]]\nname = \"router1\"\naddress = \"{addr}\"\ncommunity = \"{c}\"\ninterfaces = [\"lo\"]\n\
             [[snmp]]\nname = \"switch1\"\naddress = \"{addr}\"\nversion = \"3\"\nuser = \"{u}\"\n\
             auth_password = \"{a}\"\npriv_password = \"{p}\"\ninterfaces = [\"lo\"]\n",
            addr = agent.address(),
            c = snmpd::COMMUNITY,
            u = snmpd::V3_USER,
            a = snmpd::V3_AUTH,
            p = snmpd::V3_PRIV,
        ),
    )
    .unwrap();
    let prod = Proc::producer(&[
        "--directory",
        &daddr,
        "--no-host-sensors",
        "--source",
        "snmpagent",
        "--config",
        cfg.to_str().unwrap(),
    ]);
    let sub = Proc::start(
        &[
            "subscribe",
            "net.snmp.if",
            "--producer",
            &prod.addr,
            "--output",
            "json",
        ],
        "",
    );
    let sources = |sub: &Proc| -> Vec<String> {
        json_lines(&sub.stdout_lines().join("\n"))
            .iter()
            .map(|e| e["source"].as_str().unwrap_or("").to_string())
            .collect()
    };
    assert!(
        wait_until(Duration::from_secs(30), || {
            let s = sources(&sub);
            s.iter().any(|x| x == "router1/lo") && s.iter().any(|x| x == "switch1/lo")
        }),
        "no net.snmp.if from both devices: {:?}; producer stderr: {}",
        sources(&sub),
        prod.stderr_text()
    );
    let mut record = serde_json::Value::Null;
    assert!(
        wait_until(Duration::from_secs(30), || {
            let r = gma(
                &["search", "net.snmp.if", "--directory", &daddr, "--output", "json"],
                Duration::from_secs(10),
            );
            record = serde_json::from_str::<serde_json::Value>(&r.stdout)
                .ok()
                .and_then(|v| v.as_array().and_then(|a| a.first().cloned()))
                .unwrap_or_default();
            !record["attributes"]["snmp.devices"].is_null()
        }),
        "no producer record with snmp attributes: {record}"
    );
    let a = &record["attributes"];
    println!("directory record attributes: {a}");
    assert_eq!(a["snmp.devices"], "router1,switch1");
    assert_eq!(a["snmp.device.router1"], format!("{} v2c", agent.address()));
    assert_eq!(a["snmp.device.switch1"], format!("{} v3", agent.address()));
    assert!(a["snmp.statistics"].as_str().unwrap().contains("ifHCInOctets"));
    let stderr = prod.stderr_text();
    for secret in [snmpd::COMMUNITY, snmpd::V3_AUTH, snmpd::V3_PRIV] {
        assert!(
            !stderr.contains(secret),
            "the producer logged a credential: {stderr}"
        );
    }
}

#[test]
fn a_bad_snmp_config_stops_the_producer_with_a_clear_error_and_secrets_stay_out_of_debug() {
    use gma_producer::{Producer, ProducerConfig};
    let cfg = |snmp: Vec<SnmpDevice>, period: u64| ProducerConfig {
        host_sensors: false,
        snmp,
        snmp_period_ms: period,
        ..ProducerConfig::default()
    };
    let good = SnmpDevice::v3("sw1", "127.0.0.1:161", "u", "topsecret-auth", "topsecret-priv");
    let shown = format!("{:?}", cfg(vec![good.clone()], 1000));
    assert!(
        !shown.contains("topsecret") && shown.contains("<redacted>"),
        "{shown}"
    );
    let short = SnmpDevice {
        priv_password: Some(snmp::Secret::new("short")),
        ..good.clone()
    };
    for (c, want) in [
        (cfg(vec![short], 1000), "priv_password of at least 8"),
        (cfg(vec![good.clone(), good.clone()], 1000), "appears twice"),
        (cfg(vec![good], 0), "snmp_period_ms must be within"),
    ] {
        let e = Producer::new(c).err().expect("refused").to_string();
        assert!(e.contains(want), "{e} (wanted {want})");
        assert!(!e.contains("topsecret"), "{e}");
    }
}
