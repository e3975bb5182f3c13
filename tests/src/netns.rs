//! Network namespaces for cross-process tests: a bridge in the root namespace and one namespace
//! per host, each joined to the bridge by a veth pair, on a private /27 of 10.0.0.0/8 that no
//! address or route of the machine overlaps. The root namespace (the test process) reaches
//! every host through the bridge. Faults: a host's bridge port down (the host is cut off from
//! everyone, packets vanish) and blackhole routes between two hosts (they cannot reach each
//! other; the test process still reaches both). Everything made is deleted on drop, also when
//! the test panics.
//!
//! Capabilities: namespaces need root and `ip` (iproute2, installed with apt-get when missing
//! and possible); shaping needs `tc`. Under `CI=true` a missing capability is a failure with its
//! reason ([`missing_capability`]), never a quiet fallback.

use std::net::Ipv4Addr;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;

use super::{gma_bin, Proc};

/// True under `CI=true` (also `CI=1`): a missing capability fails the test there.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// Reports a capability a test cannot have. Under `CI=true` it panics with `what` and the
/// reason; elsewhere it prints a NOTE and the caller runs its reduced form.
pub fn missing_capability(what: &str, reason: &str) {
    if in_ci() {
        panic!("CI=true and {what} is not possible here: {reason}");
    }
    eprintln!("NOTE: {what} is not possible here ({reason}); running without it (under CI=true this fails)");
}

/// Runs `ip args...`; the error says which command failed and why.
pub fn ip(args: &[&str]) -> Result<String, String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("ip {}: {e}", args.join(" ")))?;
    if !out.status.success() {
        return Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|l| l.split_whitespace().nth(1).map(|e| e == "0"))
        })
        .unwrap_or(false)
}

fn runs(bin: &str, arg: &str) -> bool {
    Command::new(bin)
        .arg(arg)
        .output()
        .is_ok_and(|o| o.status.success())
}

static INSTALL: Mutex<()> = Mutex::new(());

/// Makes sure `bin` runs (`bin -V`), installing the Debian `package` with apt-get when it is
/// missing and this process is root (as scripts/test.sh installs Chromium). Concurrent test
/// processes wait for apt's lock rather than failing on it.
pub fn ensure_tool(bin: &str, package: &str) -> Result<(), String> {
    let _one = INSTALL.lock().unwrap_or_else(|p| p.into_inner());
    if runs(bin, "-V") {
        return Ok(());
    }
    if !is_root() {
        return Err(format!(
            "`{bin}` is missing and this test is not root: install {package} (apt-get install {package})"
        ));
    }
    eprintln!("installing {package} (apt-get) for `{bin}`");
    let apt = |args: &[&str]| {
        Command::new("apt-get")
            .env("DEBIAN_FRONTEND", "noninteractive")
            .args(["-o", "DPkg::Lock::Timeout=300", "-qq"])
            .args(args)
            .output()
            .map_err(|e| format!("apt-get: {e}"))
            .and_then(|o| {
                if o.status.success() {
                    Ok(())
                } else {
                    Err(format!(
                        "apt-get {}: {}",
                        args.join(" "),
                        String::from_utf8_lossy(&o.stderr).trim()
                    ))
                }
            })
    };
    let install = ["install", "-y", "--no-install-recommends", package];
    if apt(&install).is_err() {
        apt(&["update"])?;
        apt(&install)?;
    }
    if runs(bin, "-V") {
        Ok(())
    } else {
        Err(format!("`{bin}` still does not run after installing {package}"))
    }
}

/// Root, and `ip` (installed if missing): what namespaces need. The error says what is missing.
pub fn namespaces_possible() -> Result<(), String> {
    if std::env::var_os("GMA_TEST_NO_NETNS").is_some() {
        return Err("GMA_TEST_NO_NETNS is set".into());
    }
    if !is_root() {
        return Err("network namespaces need root (the sessions and CI run as root)".into());
    }
    ensure_tool("ip", "iproute2")
}

/// A /27 of 10.0.0.0/8 chosen by the pid (parallel test processes get different ones) that
/// no address or route of this machine overlaps.
fn free_subnet() -> Option<u32> {
    let used: Vec<(u32, u32)> = [ip(&["-4", "-o", "addr", "show"]), ip(&["-4", "route", "show"])]
        .into_iter()
        .filter_map(Result::ok)
        .flat_map(|text| {
            text.split_whitespace()
                .filter_map(|w| {
                    let (a, len) = w.split_once('/').unwrap_or((w, "32"));
                    let a: Ipv4Addr = a.parse().ok()?;
                    let len: u32 = len.parse().ok()?;
                    Some((u32::from(a), len.min(32)))
                })
                .collect::<Vec<_>>()
        })
        .collect();
    let overlaps = |net: u32| {
        used.iter().any(|(a, len)| {
            let len = (*len).min(27);
            let mask = if len == 0 { 0 } else { u32::MAX << (32 - len) };
            (a & mask) == (net & mask)
        })
    };
    let base = u32::from(Ipv4Addr::new(10, 0, 0, 0));
    let first = std::process::id() % (1 << 19);
    (0..64)
        .map(|k| base + ((first + k * 7919) % (1 << 19)) * 32)
        .find(|net| !overlaps(*net))
}

/// Names carry the pid (so leftovers of a killed test run can be found) and a per-process
/// counter (several segments in one process, e.g. `cargo test` threads, do not collide).
/// Interface names stay within the kernel's 15 characters: `gt<pid><role><n><i>`.
static SEGMENTS: AtomicU32 = AtomicU32::new(0);
/// Serializes subnet choice and set-up within this process.
static SETUP: Mutex<()> = Mutex::new(());

fn pid_alive(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// Deletes namespaces and links a killed test run left behind (their pid is gone).
fn sweep_leftovers() {
    if let Ok(list) = ip(&["netns", "list"]) {
        for name in list.lines().filter_map(|l| l.split_whitespace().next()) {
            let pid = name
                .strip_prefix("gt-")
                .and_then(|r| r.split('-').next())
                .and_then(|p| p.parse::<u32>().ok());
            if pid.is_some_and(|p| !pid_alive(p)) {
                let _ = ip(&["netns", "del", name]);
            }
        }
    }
    if let Ok(list) = ip(&["-o", "link", "show"]) {
        for line in list.lines() {
            let Some(name) = line.split(": ").nth(1).map(|n| n.split('@').next().unwrap_or(n)) else {
                continue;
            };
            let Some(rest) = name.strip_prefix("gt") else {
                continue;
            };
            let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
            let role = rest[digits.len()..].chars().next();
            if matches!(role, Some('b' | 'h')) && digits.parse::<u32>().is_ok_and(|p| !pid_alive(p)) {
                let _ = ip(&["link", "del", name]);
            }
        }
    }
}

/// Hosts on one segment; see the module doc. Fields are public for tests that need the names.
pub struct Segment {
    pub namespaces: Vec<String>,
    /// Root-side end of each host's veth (a bridge port): traffic toward host i leaves the
    /// bridge here, so shaping it shapes every path into host i; down cuts host i off.
    pub links: Vec<String>,
    pub bridge: Option<String>,
    /// The root namespace's address on the segment (the test process, roles run beside it).
    pub root_ip: String,
    pub host_ips: Vec<String>,
}

impl Segment {
    /// `hosts` hosts sharing loopback: what a test outside CI may run on when namespaces cannot
    /// be made (after [`missing_capability`]); nothing can be cut, blocked or shaped.
    pub fn loopback(hosts: usize) -> Segment {
        Segment {
            namespaces: Vec::new(),
            links: Vec::new(),
            bridge: None,
            root_ip: "127.0.0.1".into(),
            host_ips: vec!["127.0.0.1".into(); hosts],
        }
    }

    /// `hosts` namespaces on a new bridge. Fails with what is missing or which step failed;
    /// whatever was made before a failing step is deleted.
    pub fn new(hosts: usize) -> Result<Segment, String> {
        namespaces_possible()?;
        let _one = SETUP.lock().unwrap_or_else(|p| p.into_inner());
        sweep_leftovers();
        let net = free_subnet().ok_or("no free 10.x /27")?;
        let addr = |i: u32| Ipv4Addr::from(net + i).to_string();
        let pid = std::process::id();
        let n = SEGMENTS.fetch_add(1, Ordering::SeqCst);
        let tag = char::from_digit(n % 36, 36).unwrap_or('z');
        let mut seg = Segment {
            namespaces: Vec::new(),
            links: Vec::new(),
            bridge: None,
            root_ip: addr(1),
            host_ips: Vec::new(),
        };
        // From here on, whatever was made is undone by Drop if a step fails.
        let br = format!("gt{pid}b{tag}");
        ip(&["link", "add", &br, "type", "bridge"])?;
        seg.bridge = Some(br.clone());
        ip(&["addr", "add", &format!("{}/27", addr(1)), "dev", &br])?;
        ip(&["link", "set", &br, "up"])?;
        for i in 0..hosts {
            let ns = format!("gt-{pid}-{n}-{i}");
            let (host_end, ns_end) = (format!("gt{pid}h{tag}{i}"), format!("eth{i}"));
            ip(&["netns", "add", &ns])?;
            seg.namespaces.push(ns.clone());
            ip(&[
                "link", "add", &host_end, "type", "veth", "peer", "name", &ns_end, "netns", &ns,
            ])?;
            seg.links.push(host_end.clone());
            ip(&["link", "set", &host_end, "master", &br])?;
            ip(&["link", "set", &host_end, "up"])?;
            let a = addr(10 + i as u32);
            ip(&["-n", &ns, "addr", "add", &format!("{a}/27"), "dev", &ns_end])?;
            ip(&["-n", &ns, "link", "set", &ns_end, "up"])?;
            ip(&["-n", &ns, "link", "set", "lo", "up"])?;
            seg.host_ips.push(a);
        }
        eprintln!(
            "segment: bridge {br} {}/27, hosts {:?} in namespaces {:?}",
            seg.root_ip, seg.host_ips, seg.namespaces
        );
        Ok(seg)
    }

    /// `tc qdisc add dev <link toward host i> root tbf rate <rate> burst 32kbit latency 50ms`.
    pub fn shape_toward(&self, i: usize, rate: &str) -> Result<(), String> {
        let dev = self
            .links
            .get(i)
            .ok_or("no link to shape: the hosts share loopback")?;
        ensure_tool("tc", "iproute2")?;
        let out = Command::new("tc")
            .args(["qdisc", "add", "dev", dev, "root", "tbf", "rate", rate])
            .args(["burst", "32kbit", "latency", "50ms"])
            .output()
            .map_err(|e| format!("tc: {e}"))?;
        if !out.status.success() {
            return Err(format!("tc: {}", String::from_utf8_lossy(&out.stderr).trim()));
        }
        Ok(())
    }

    /// `ip netns exec <ns of host i> gma`: a launcher that execs, so the child is gma itself.
    pub fn gma_in(&self, i: usize) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.namespaces[i]]).arg(gma_bin());
        cmd
    }

    /// Starts `gma args...` as host `i` (inside its namespace; on loopback when the segment
    /// has no namespaces).
    pub fn start_on_host(&self, i: usize, args: &[&str], marker: &str) -> Proc {
        if self.namespaces.get(i).is_some() {
            Proc::start_cmd(self.gma_in(i), args, marker)
        } else {
            Proc::start(args, marker)
        }
    }

    /// Host `i`'s bridge port down: every packet to or from it is dropped (peers and the test
    /// process alike); `connect` to it times out.
    pub fn cut(&self, i: usize) -> Result<(), String> {
        ip(&["link", "set", &self.links[i], "down"]).map(|_| ())
    }

    /// Undoes [`Segment::cut`].
    pub fn uncut(&self, i: usize) -> Result<(), String> {
        ip(&["link", "set", &self.links[i], "up"]).map(|_| ())
    }

    /// Hosts `a` and `b` can no longer exchange packets: a blackhole route toward the other in
    /// each namespace (the test process still reaches both).
    pub fn block(&self, a: usize, b: usize) -> Result<(), String> {
        for (from, to) in [(a, b), (b, a)] {
            let dst = format!("{}/32", self.host_ips[to]);
            ip(&[
                "-n",
                &self.namespaces[from],
                "route",
                "replace",
                "blackhole",
                &dst,
            ])?;
        }
        Ok(())
    }

    /// Undoes [`Segment::block`] (no error when there was nothing to undo).
    pub fn unblock(&self, a: usize, b: usize) -> Result<(), String> {
        for (from, to) in [(a, b), (b, a)] {
            let dst = format!("{}/32", self.host_ips[to]);
            let routes = ip(&["-n", &self.namespaces[from], "route", "show", &dst])?;
            if routes.contains("blackhole") {
                ip(&["-n", &self.namespaces[from], "route", "del", "blackhole", &dst])?;
            }
        }
        Ok(())
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        // Deleting one end of a veth deletes the pair at once (a deleted namespace only takes
        // its devices along when the kernel gets round to destroying it).
        for l in &self.links {
            let _ = ip(&["link", "del", l]);
        }
        for ns in &self.namespaces {
            let _ = ip(&["netns", "del", ns]);
        }
        if let Some(br) = &self.bridge {
            let _ = ip(&["link", "del", br]);
        }
    }
}
