//! A throw-away net-snmp agent for the SNMP tests (docs/snmp.md; the recipe of the project's
//! notes on real parts): `snmpd -f` with a generated config under a temp dir, bound to
//! 127.0.0.1 on a free UDP port, with a v2c community, an SNMPv3 authPriv user (SHA, AES) and a
//! write community used once, by [`Snmpd::disable_if_cache`]. Dropping the [`Snmpd`] stops it.
//!
//! [`snmpd_or_skip`] turns "cannot start" into a failure under `CI=true` and a skip message
//! elsewhere. scripts/test.sh installs `snmpd` and `snmp` when missing.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::netns::in_ci;
use crate::slurm::which;
use crate::wait_until;

pub const COMMUNITY: &str = "gmaro";
/// Write access, only to switch off the agent's interface cache.
const RW_COMMUNITY: &str = "gmarw";
pub const V3_USER: &str = "gmauser";
pub const V3_AUTH: &str = "gmaauthpass1";
pub const V3_PRIV: &str = "gmaprivpass1";

/// NET-SNMP-AGENT-MIB::nsCacheTimeout of the ifTable cache (which also feeds ifXTable).
const IF_CACHE_TIMEOUT: &str = "1.3.6.1.4.1.8072.1.5.3.1.2.1.3.6.1.2.1.2.2";
const SYS_UPTIME: &str = "1.3.6.1.2.1.1.3.0";

/// A running agent.
pub struct Snmpd {
    pub dir: tempfile::TempDir,
    pub port: u16,
    child: Option<Child>,
}

impl Snmpd {
    /// Starts an agent and waits until it answers (at most 15 s).
    pub fn start() -> Result<Snmpd, String> {
        for p in ["snmpd", "snmpget", "snmpset"] {
            if !which(p) {
                return Err(format!("{p} is not installed (apt-get install snmpd snmp)"));
            }
        }
        let dir = tempfile::tempdir().map_err(|e| format!("temp dir: {e}"))?;
        let port = crate::reserved_port();
        let conf = format!(
            "agentAddress udp:127.0.0.1:{port}\n\
             rocommunity {COMMUNITY} 127.0.0.1\n\
             rwcommunity {RW_COMMUNITY} 127.0.0.1\n\
             createUser {V3_USER} SHA \"{V3_AUTH}\" AES \"{V3_PRIV}\"\n\
             rouser {V3_USER} priv\n\
             dontLogTCPWrappersConnects yes\n"
        );
        std::fs::write(dir.path().join("snmpd.conf"), conf).map_err(|e| format!("snmpd.conf: {e}"))?;
        for d in ["persist", "cli"] {
            let p = dir.path().join(d);
            std::fs::create_dir_all(&p).map_err(|e| format!("{}: {e}", p.display()))?;
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o700))
                .map_err(|e| format!("chmod {}: {e}", p.display()))?;
        }
        let mut s = Snmpd {
            dir,
            port,
            child: None,
        };
        s.launch()?;
        Ok(s)
    }

    /// `127.0.0.1:<port>`.
    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn launch(&mut self) -> Result<(), String> {
        let log = std::fs::File::create(self.path("snmpd.log")).map_err(|e| format!("snmpd.log: {e}"))?;
        let err = log.try_clone().map_err(|e| format!("snmpd.log: {e}"))?;
        let child = Command::new("snmpd")
            .args(["-f", "-Lo", "-C", "-m", "", "-c"])
            .arg(self.path("snmpd.conf"))
            .arg("-p")
            .arg(self.path("snmpd.pid"))
            .env("SNMP_PERSISTENT_DIR", self.path("persist"))
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err)
            .spawn()
            .map_err(|e| format!("cannot run snmpd: {e}"))?;
        self.child = Some(child);
        if !wait_until(Duration::from_secs(15), || {
            self.cli("snmpget", &["-v2c", "-c", COMMUNITY], &[SYS_UPTIME])
                .is_ok()
        }) {
            let log = self.log();
            self.stop();
            return Err(format!("snmpd did not answer within 15 s; its log: {log}"));
        }
        Ok(())
    }

    /// Runs a net-snmp command line tool against the agent: `flags`, the agent address, then
    /// `oids` (numeric OIDs, 0.5 s timeout, no retry).
    pub fn cli(&self, tool: &str, flags: &[&str], oids: &[&str]) -> Result<String, String> {
        let out = Command::new(tool)
            .args(["-On", "-t", "0.5", "-r", "0"])
            .args(flags)
            .arg(self.address())
            .args(oids)
            .env("SNMP_PERSISTENT_DIR", self.path("cli"))
            .output()
            .map_err(|e| format!("{tool}: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "{tool} failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Switches off the agent's interface cache (net-snmp keeps ifTable/ifXTable for 3 s by
    /// default), so every read of a counter is the kernel's value at that read.
    pub fn disable_if_cache(&self) -> Result<(), String> {
        self.cli(
            "snmpset",
            &["-v2c", "-c", RW_COMMUNITY],
            &[IF_CACHE_TIMEOUT, "i", "0"],
        )
        .map(|_| ())
    }

    /// The agent's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.path("snmpd.log")).unwrap_or_default()
    }

    /// Stops the agent (SIGTERM, then SIGKILL after 5 s).
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = Command::new("kill").arg(c.id().to_string()).status();
            let stopped = wait_until(Duration::from_secs(5), || matches!(c.try_wait(), Ok(Some(_))));
            if !stopped {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }

    /// Stops the agent and starts it again on the same port with the same files.
    pub fn restart(&mut self) -> Result<(), String> {
        self.stop();
        self.launch()
    }
}

impl Drop for Snmpd {
    fn drop(&mut self) {
        self.stop();
    }
}

/// An agent for `test`: under `CI=true` one that cannot start fails the test with the reason;
/// elsewhere the test prints why it is skipped.
pub fn snmpd_or_skip(test: &str) -> Option<Snmpd> {
    match Snmpd::start() {
        Ok(s) => Some(s),
        Err(e) if in_ci() => panic!("CI=true and {test} needs snmpd, which cannot start here: {e}"),
        Err(e) => {
            eprintln!("SKIPPED {test}: snmpd cannot start here ({e}); under CI=true this fails");
            None
        }
    }
}
