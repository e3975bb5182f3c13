//! `net.tcp`: TCP counters from the `Tcp:` header/value line pair of `/proc/net/snmp`.
//!
//! Columns are found by header name, not position: kernels have added columns over time
//! (`InCsumErrors` in 3.10) and may again.

use crate::procfs::{elapsed_s, parse_num, rate, Emit, Files, Probe};
use crate::SensorError;

const SNMP: &str = "/proc/net/snmp";

/// The `Tcp:` values `net.tcp` uses (all cumulative except `curr_estab`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TcpCounters {
    pub active_opens: u64,
    pub curr_estab: u64,
    pub in_errs: u64,
    pub out_segs: u64,
    pub retrans_segs: u64,
}

/// Parses the first `Tcp:` header line and the `Tcp:` value line right after it.
pub fn parse_snmp_tcp(text: &str) -> Result<TcpCounters, SensorError> {
    let mut lines = text.lines().enumerate();
    let (hi, header) = lines
        .by_ref()
        .find(|(_, l)| l.starts_with("Tcp:"))
        .ok_or_else(|| SensorError::parse(SNMP, 0, "no Tcp: lines"))?;
    let (vi, values) = lines
        .next()
        .filter(|(_, l)| l.starts_with("Tcp:"))
        .ok_or_else(|| SensorError::parse(SNMP, hi + 1, "Tcp: header not followed by a Tcp: value line"))?;
    // Header names and values side by side, in one pass and without collecting either line
    // (this parse runs every second); the first column of a name counts.
    const WANTED: [&str; 5] = ["ActiveOpens", "CurrEstab", "InErrs", "OutSegs", "RetransSegs"];
    let mut found: [Option<&str>; 5] = [None; 5];
    let mut names = header.split_ascii_whitespace().skip(1);
    let mut vals = values.split_ascii_whitespace().skip(1);
    let (mut n_names, mut n_vals) = (0usize, 0usize);
    loop {
        match (names.next(), vals.next()) {
            (Some(name), Some(val)) => {
                n_names += 1;
                n_vals += 1;
                if let Some(i) = WANTED.iter().position(|w| *w == name) {
                    found[i].get_or_insert(val);
                }
            }
            (Some(_), None) => {
                n_names += 1 + names.count();
                break;
            }
            (None, Some(_)) => {
                n_vals += 1 + vals.count();
                break;
            }
            (None, None) => break,
        }
    }
    if n_names != n_vals {
        return Err(SensorError::parse(
            SNMP,
            vi + 1,
            format!("{n_vals} Tcp: values for {n_names} header names"),
        ));
    }
    let get = |i: usize| -> Result<u64, SensorError> {
        let name = WANTED[i];
        let val = found[i].ok_or_else(|| {
            SensorError::parse(SNMP, hi + 1, format!("no {name} column in the Tcp: header"))
        })?;
        parse_num(Some(val), SNMP, vi + 1, name)
    };
    Ok(TcpCounters {
        active_opens: get(0)?,
        curr_estab: get(1)?,
        in_errs: get(2)?,
        out_segs: get(3)?,
        retrans_segs: get(4)?,
    })
}

/// The `net.tcp` numbers, in schema order. `retrans_pct` is retransmitted over sent segments
/// (Linux's OutSegs excludes retransmissions), 0 when nothing was sent.
pub fn tcp_values(prev: &TcpCounters, cur: &TcpCounters, dt_s: f64) -> [f64; 6] {
    let retrans = cur.retrans_segs.saturating_sub(prev.retrans_segs);
    let sent = cur.out_segs.saturating_sub(prev.out_segs);
    let retrans_pct = if sent == 0 {
        0.0
    } else {
        retrans as f64 * 100.0 / sent as f64
    };
    [
        rate(prev.retrans_segs, cur.retrans_segs, dt_s),
        rate(prev.out_segs, cur.out_segs, dt_s),
        rate(prev.in_errs, cur.in_errs, dt_s),
        retrans_pct,
        rate(prev.active_opens, cur.active_opens, dt_s),
        cur.curr_estab as f64,
    ]
}

/// Emits `net.tcp`. The first sample only records the baseline.
#[derive(Default)]
pub(crate) struct Tcp {
    prev: Option<(i64, TcpCounters)>,
}

impl Probe for Tcp {
    fn sample(&mut self, files: &mut Files, out: &mut Emit<'_>) -> Result<(), SensorError> {
        let cur = files.read("net/snmp", parse_snmp_tcp)?;
        if let Some((prev_ns, prev)) = self.prev.replace((out.now_ns, cur)) {
            if let Some(dt) = elapsed_s(prev_ns, out.now_ns) {
                out.push(tcp_values(&prev, &cur, dt).to_vec(), Vec::new());
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SNMP_A: &str = "\
Ip: Forwarding DefaultTTL InReceives InHdrErrors InAddrErrors ForwDatagrams InUnknownProtos InDiscards InDelivers OutRequests OutDiscards OutNoRoutes ReasmTimeout ReasmReqds ReasmOKs ReasmFails FragOKs FragFails FragCreates
Ip: 1 64 25922438 0 2 0 0 0 25917781 19563201 28 40 0 0 0 0 0 0 0
Icmp: InMsgs InErrors InCsumErrors InDestUnreachs InTimeExcds InParmProbs InSrcQuenchs InRedirects InEchos InEchoReps InTimestamps InTimestampReps InAddrMasks InAddrMaskReps OutMsgs OutErrors OutDestUnreachs OutTimeExcds OutParmProbs OutSrcQuenchs OutRedirects OutEchos OutEchoReps OutTimestamps OutTimestampReps OutAddrMasks OutAddrMaskReps
Icmp: 2310 12 0 2250 0 0 0 0 55 5 0 0 0 0 2346 0 2286 0 0 0 0 5 55 0 0 0 0
Tcp: RtoAlgorithm RtoMin RtoMax MaxConn ActiveOpens PassiveOpens AttemptFails EstabResets CurrEstab InSegs OutSegs RetransSegs InErrs OutRsts InCsumErrors
Tcp: 1 200 120000 -1 401234 10234 3021 4412 27 24988450 21834511 12045 7 30411 0
Udp: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors InCsumErrors IgnoredMulti
Udp: 912345 2110 0 914402 0 0 0 4821
";

    /// An older layout: no InCsumErrors, columns in another order.
    const SNMP_B: &str = "\
Tcp: RtoAlgorithm RtoMin RtoMax MaxConn PassiveOpens ActiveOpens AttemptFails EstabResets CurrEstab InSegs RetransSegs OutSegs InErrs OutRsts
Tcp: 1 200 120000 -1 10240 401334 3021 4412 30 24989450 12065 21835511 9 30411
";

    #[test]
    fn parses_by_header_name() {
        let a = parse_snmp_tcp(SNMP_A).unwrap();
        assert_eq!(
            a,
            TcpCounters {
                active_opens: 401234,
                curr_estab: 27,
                in_errs: 7,
                out_segs: 21834511,
                retrans_segs: 12045
            }
        );
        let b = parse_snmp_tcp(SNMP_B).unwrap();
        assert_eq!(b.out_segs, 21835511);
        assert_eq!(b.retrans_segs, 12065);
        let v = tcp_values(&a, &b, 2.0);
        assert_eq!(v, [10.0, 500.0, 1.0, 2.0, 50.0, 30.0]);
        let wrapped = tcp_values(&b, &a, 1.0);
        assert_eq!(wrapped, [0.0, 0.0, 0.0, 0.0, 0.0, 27.0]);
    }

    #[test]
    fn malformed_snmp_is_an_error() {
        for bad in [
            "",
            "Ip: a b\nIp: 1 2\n",
            "Tcp: ActiveOpens CurrEstab\n",
            "Tcp: ActiveOpens CurrEstab\nUdp: 1 2\n",
            "Tcp: ActiveOpens CurrEstab InErrs OutSegs RetransSegs\nTcp: 1 2 3 4\n",
            "Tcp: ActiveOpens CurrEstab InErrs OutSegs RetransSegs\nTcp: 1 2 3 x 5\n",
            "Tcp: ActiveOpens CurrEstab InErrs OutSegs\nTcp: 1 2 3 4\n",
        ] {
            assert!(parse_snmp_tcp(bad).is_err(), "{bad:?}");
        }
        let e = parse_snmp_tcp("Tcp: ActiveOpens CurrEstab InErrs OutSegs\nTcp: 1 2 3 4\n").unwrap_err();
        assert!(e.to_string().contains("RetransSegs"), "{e}");
    }
}
