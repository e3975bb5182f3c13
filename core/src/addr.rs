//! Endpoint addresses: `host:port` for listeners, `http://host:port` for clients.

use std::fs::{File, OpenOptions, TryLockError};
use std::io;
use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::path::PathBuf;

/// Turns `127.0.0.1:7000` or `http://127.0.0.1:7000` into a client endpoint URI.
pub fn endpoint_uri(addr: &str) -> String {
    if addr.starts_with("http://") || addr.starts_with("https://") {
        addr.to_string()
    } else {
        format!("http://{addr}")
    }
}

/// The address a listener advertises: the bound address, with an unspecified IP (0.0.0.0)
/// replaced by loopback so the advertised address is one a peer on this host can dial.
pub fn advertised(bound: SocketAddr) -> String {
    let ip = if bound.ip().is_unspecified() {
        match bound {
            SocketAddr::V4(_) => "127.0.0.1".to_string(),
            SocketAddr::V6(_) => "[::1]".to_string(),
        }
    } else {
        match bound {
            SocketAddr::V4(a) => a.ip().to_string(),
            SocketAddr::V6(a) => format!("[{}]", a.ip()),
        }
    };
    format!("http://{ip}:{}", bound.port())
}

/// The ports [`reserve_port`] hands out, before the kernel's ephemeral range is taken out.
const RESERVED_POOL: std::ops::RangeInclusive<u16> = 20_000..=32_767;

/// A loopback port kept for a process about to be started that must know its address (and its
/// peers' addresses) before it binds: a directory member, etcd, slurmctld, snmpd. The port lies
/// outside the kernel's ephemeral range, so no `connect()` and no `bind(…:0)` on the machine can
/// take it between the choice and the child's bind, and every other caller of [`reserve_port`]
/// passes it over while the lease lives (an exclusive `flock` on a file named after it, which the
/// kernel drops with the process). A port found free by binding port 0 and closing it had
/// neither guard: parallel tests' outgoing connections took such ports now and then.
#[derive(Debug)]
pub struct PortLease {
    port: u16,
    _lock: File,
}

impl PortLease {
    pub fn port(&self) -> u16 {
        self.port
    }
}

/// Reserves a TCP and UDP port of 127.0.0.1 free at the time of the call (see [`PortLease`]).
pub fn reserve_port() -> io::Result<PortLease> {
    let (low, high) = ephemeral_range();
    let pool: Vec<u16> = RESERVED_POOL.filter(|p| *p < low || *p > high).collect();
    if pool.is_empty() {
        return Err(io::Error::other(format!(
            "no port of {}-{} lies outside the kernel's ephemeral range {low}-{high}",
            RESERVED_POOL.start(),
            RESERVED_POOL.end()
        )));
    }
    // Callers in parallel start their search at different places, so they seldom meet a lock.
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let start = (std::process::id().wrapping_mul(2_654_435_761) ^ nanos) as usize % pool.len();
    reserve_in(&lock_dir(), &pool, start).map_err(|e| match e.kind() {
        io::ErrorKind::AddrInUse => io::Error::new(
            e.kind(),
            format!(
                "every port of {}-{} outside the ephemeral range {low}-{high} is in use or reserved",
                RESERVED_POOL.start(),
                RESERVED_POOL.end()
            ),
        ),
        _ => e,
    })
}

/// `n` ports at once ([`reserve_port`]), for a cluster whose members must know each other's
/// addresses before any starts.
pub fn reserve_ports(n: usize) -> io::Result<Vec<PortLease>> {
    (0..n).map(|_| reserve_port()).collect()
}

/// The first port of `pool`, from `start` on, that no lease in `dir` holds and that binds.
fn reserve_in(dir: &std::path::Path, pool: &[u16], start: usize) -> io::Result<PortLease> {
    std::fs::create_dir_all(dir).map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", dir.display())))?;
    for i in 0..pool.len() {
        let port = pool[(start + i) % pool.len()];
        let path = dir.join(port.to_string());
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => continue,
            Err(TryLockError::Error(e)) => {
                return Err(io::Error::new(e.kind(), format!("lock {}: {e}", path.display())));
            }
        }
        let free =
            TcpListener::bind(("127.0.0.1", port)).is_ok() && UdpSocket::bind(("127.0.0.1", port)).is_ok();
        if free {
            return Ok(PortLease { port, _lock: lock });
        }
    }
    Err(io::Error::from(io::ErrorKind::AddrInUse))
}

/// Where the leases' lock files live: one directory for every user of the machine's loopback.
fn lock_dir() -> PathBuf {
    std::env::temp_dir().join("gma-ports")
}

/// The kernel's range for ports it picks itself (`net.ipv4.ip_local_port_range`), or Linux's
/// default when it cannot be read.
fn ephemeral_range() -> (u16, u16) {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| {
            let mut it = s.split_whitespace().map(|x| x.parse::<u16>().ok());
            Some((it.next()??, it.next()??))
        })
        .unwrap_or((32_768, 60_999))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uris() {
        assert_eq!(endpoint_uri("127.0.0.1:1"), "http://127.0.0.1:1");
        assert_eq!(endpoint_uri("http://x:1"), "http://x:1");
        assert_eq!(advertised("0.0.0.0:5".parse().unwrap()), "http://127.0.0.1:5");
        assert_eq!(advertised("127.0.0.1:5".parse().unwrap()), "http://127.0.0.1:5");
    }

    #[test]
    fn a_reserved_port_is_outside_the_ephemeral_range_and_not_handed_out_twice() {
        let (low, high) = ephemeral_range();
        let leases = reserve_ports(20).unwrap();
        let ports: std::collections::BTreeSet<u16> = leases.iter().map(PortLease::port).collect();
        assert_eq!(ports.len(), leases.len(), "a port handed out twice: {ports:?}");
        for p in &ports {
            assert!(
                *p < low || *p > high,
                "{p} is in the ephemeral range {low}-{high}"
            );
            assert!(RESERVED_POOL.contains(p));
            // Free for the child it is meant for.
            TcpListener::bind(("127.0.0.1", *p)).unwrap();
        }
    }

    #[test]
    fn a_port_leased_or_bound_by_another_is_passed_over() {
        let dir = tempfile::tempdir().unwrap();
        // Ports no other caller in the machine's lock directory will take meanwhile.
        let (a, b) = (reserve_port().unwrap(), reserve_port().unwrap());
        let pool = [a.port(), b.port()];
        let held = reserve_in(dir.path(), &pool, 0).unwrap();
        assert_eq!(held.port(), pool[0]);
        assert_eq!(
            reserve_in(dir.path(), &pool, 0).unwrap().port(),
            pool[1],
            "a leased port"
        );
        drop(held);
        let _bound = TcpListener::bind(("127.0.0.1", pool[0])).unwrap();
        let other = reserve_in(dir.path(), &pool, 0).unwrap();
        assert_eq!(other.port(), pool[1], "a bound port");
        let err = reserve_in(dir.path(), &pool, 0).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::AddrInUse);
        drop(other);
        assert_eq!(
            reserve_in(dir.path(), &pool, 1).unwrap().port(),
            pool[1],
            "a lease ends with its value"
        );
    }
}
