//! `host.net`: per-interface traffic rates from `/proc/net/dev` deltas.

use crate::procfs::{parse_num, rate, Emit, Files, PartRates, Probe};
use crate::SensorError;

const NET_DEV: &str = "/proc/net/dev";

/// The cumulative counters of one interface that `host.net` publishes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct NetDevCounters {
    pub rx_bytes: u64,
    pub rx_packets: u64,
    pub rx_errors: u64,
    pub tx_bytes: u64,
    pub tx_packets: u64,
    pub tx_errors: u64,
}

/// One interface line; the name borrows from the parsed text (no allocation per line).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NetDev<'a> {
    pub iface: &'a str,
    pub counters: NetDevCounters,
}

/// Parses `/proc/net/dev`: two header lines, then `iface: rx(8 columns) tx(8 columns)`. Old
/// kernels print no space after the colon (`eth0:1234`), so the name is split at the colon,
/// not at whitespace.
pub fn parse_net_dev(text: &str) -> Result<Vec<NetDev<'_>>, SensorError> {
    let mut out = Vec::new();
    let mut lines = text.lines().enumerate();
    for want in ["Inter-|", " face |"] {
        match lines.next() {
            Some((_, l)) if l.trim_start().starts_with(want.trim_start()) => {}
            _ => return Err(SensorError::parse(NET_DEV, 1, "missing the two header lines")),
        }
    }
    for (i, line) in lines {
        if line.trim().is_empty() {
            continue;
        }
        let n = i + 1;
        let (name, rest) = line
            .split_once(':')
            .ok_or_else(|| SensorError::parse(NET_DEV, n, "no \"iface:\" prefix"))?;
        let iface = name.trim();
        if iface.is_empty() {
            return Err(SensorError::parse(NET_DEV, n, "empty interface name"));
        }
        let mut v = [0u64; 16];
        let mut toks = rest.split_ascii_whitespace();
        for (k, slot) in v.iter_mut().enumerate() {
            *slot = parse_num(toks.next(), NET_DEV, n, COLUMNS[k])?;
        }
        out.push(NetDev {
            iface,
            counters: NetDevCounters {
                rx_bytes: v[0],
                rx_packets: v[1],
                rx_errors: v[2],
                tx_bytes: v[8],
                tx_packets: v[9],
                tx_errors: v[10],
            },
        });
    }
    Ok(out)
}

const COLUMNS: [&str; 16] = [
    "rx bytes",
    "rx packets",
    "rx errs",
    "rx drop",
    "rx fifo",
    "rx frame",
    "rx compressed",
    "rx multicast",
    "tx bytes",
    "tx packets",
    "tx errs",
    "tx drop",
    "tx fifo",
    "tx colls",
    "tx carrier",
    "tx compressed",
];

/// The `host.net` numbers for one interface, in schema order.
pub fn net_rates(prev: &NetDevCounters, cur: &NetDevCounters, dt_s: f64) -> [f64; 6] {
    [
        rate(prev.rx_bytes, cur.rx_bytes, dt_s),
        rate(prev.tx_bytes, cur.tx_bytes, dt_s),
        rate(prev.rx_packets, cur.rx_packets, dt_s),
        rate(prev.tx_packets, cur.tx_packets, dt_s),
        rate(prev.rx_errors, cur.rx_errors, dt_s),
        rate(prev.tx_errors, cur.tx_errors, dt_s),
    ]
}

/// Emits one `host.net` per interface. An interface's first sighting is its baseline.
#[derive(Default)]
pub(crate) struct Net {
    ifaces: PartRates<NetDevCounters>,
}

impl Probe for Net {
    fn sample(&mut self, files: &mut Files, out: &mut Emit<'_>) -> Result<(), SensorError> {
        let devs = files.read("net/dev", parse_net_dev)?;
        let parts = devs.iter().map(|d| (d.iface, d.counters));
        self.ifaces.sample(parts, out, net_rates);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Sensor;

    const NET_DEV_A: &str = "\
Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed
    lo: 1181234    9871    0    0    0     0          0         0  1181234    9871    0    0    0     0       0          0
  eth0: 9045123456 7034561    3    0    0     0          0      1203 812345678 2034567    1    0    0     0       0          0
wlan0:100 2 0 0 0 0 0 0 200 4 0 0 0 0 0 0
";

    const NET_DEV_B: &str = "\
Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed
    lo: 1183234    9891    0    0    0     0          0         0  1183234    9891    0    0    0     0       0          0
  eth0: 9045223456 7034661    5    0    0     0          0      1203 812355678 2034587    1    0    0     0       0          0
  eth1: 1 1 0 0 0 0 0 0 1 1 0 0 0 0 0 0
";

    #[test]
    fn parses_net_dev() {
        let d = parse_net_dev(NET_DEV_A).unwrap();
        assert_eq!(d.len(), 3);
        assert_eq!(d[0].iface, "lo");
        assert_eq!(d[1].iface, "eth0");
        assert_eq!(d[1].counters.rx_bytes, 9045123456);
        assert_eq!(d[1].counters.rx_errors, 3);
        assert_eq!(d[1].counters.tx_packets, 2034567);
        assert_eq!(d[2].iface, "wlan0");
        assert_eq!(d[2].counters.tx_bytes, 200);
    }

    #[test]
    fn malformed_net_dev_is_an_error() {
        let header = NET_DEV_A.lines().take(2).collect::<Vec<_>>().join("\n");
        for bad in [
            String::new(),
            "eth0: 1 2 3\n".to_string(),
            format!("{header}\neth0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16\n"),
            format!("{header}\neth0: 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15\n"),
            format!("{header}\neth0: 1 2 3 4 5 6 7 8 9 x 11 12 13 14 15 16\n"),
            format!("{header}\n: 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16\n"),
        ] {
            assert!(parse_net_dev(&bad).is_err(), "{bad:?}");
        }
        let e = parse_net_dev(&format!(
            "{header}\neth0: 1 2 3 4 5 6 7 8 9 x 11 12 13 14 15 16\n"
        ))
        .unwrap_err();
        assert!(
            e.to_string().contains("line 3") && e.to_string().contains("tx packets"),
            "{e}"
        );
    }

    #[test]
    fn rates_and_wrap() {
        let a = parse_net_dev(NET_DEV_A).unwrap();
        let b = parse_net_dev(NET_DEV_B).unwrap();
        let r = net_rates(&a[1].counters, &b[1].counters, 2.0);
        assert_eq!(r, [50000.0, 5000.0, 50.0, 10.0, 1.0, 0.0]);
        // a reset interface (b -> a) gives zeros, not negatives
        assert!(net_rates(&b[1].counters, &a[1].counters, 1.0)
            .iter()
            .all(|&x| x == 0.0));
    }

    #[test]
    fn sensor_baselines_new_interfaces_and_forgets_gone_ones() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("net")).unwrap();
        let cfg = crate::HostSensorConfig {
            proc_root: dir.path().to_path_buf(),
            ..crate::HostSensorConfig::new("h")
        };
        let mut s = crate::procfs::ProcSensor::host(&cfg, crate::schemas::host_net(), Net::default());
        let mut out = Vec::new();
        assert!(s.sample(0, &mut out).is_err(), "missing file must be an error");
        std::fs::write(dir.path().join("net/dev"), NET_DEV_A).unwrap();
        s.sample(1_000_000_000, &mut out).unwrap();
        assert!(out.is_empty(), "first sample is the baseline");
        std::fs::write(dir.path().join("net/dev"), NET_DEV_B).unwrap();
        s.sample(3_000_000_000, &mut out).unwrap();
        // lo and eth0 have a baseline; eth1 is new; wlan0 is gone
        let sources: Vec<&str> = out.iter().map(|e| e.source.as_str()).collect();
        assert_eq!(sources, ["h/lo", "h/eth0"]);
        assert_eq!(out[1].strings, ["eth0"]);
        assert_eq!(out[1].numbers[0], 50000.0);
        let known = s.probe().ifaces.names();
        assert_eq!(known.len(), 3);
        assert!(!known.contains("wlan0"));
    }
}
