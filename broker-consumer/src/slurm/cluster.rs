//! A throw-away single-machine Slurm cluster (docs/slurm.md; the recipe of the project's notes
//! on real parts), for `gma bench slurm` and the tests' kit: a generated munge key and its own
//! `munged`, a generated `slurm.conf`, `slurmctld` and one `slurmd` per node (one node by
//! default; several with [`Cluster::start_nodes`], each on its own port) — all under a temp
//! dir, on ports chosen free, bound to 127.0.0.1
//! (`CommunicationParameters=NoCtldInAddrAny,NoInAddrAny`), with `batch_sched_delay=0` and a
//! backfill pass every second (`bf_interval=1`, so pending jobs get their expected start at
//! once; [`SCHEDULER_PARAMETERS`]). Dropping the [`Cluster`] cancels its jobs, stops the
//! daemons, kills any `slurmstepd` they left behind and stops `munged`.
//!
//! [`Cluster::start`] says why a cluster cannot be started (not installed, not root, a daemon
//! that would not start, with its log). scripts/test.sh installs
//! `slurmctld slurmd slurm-client munge` when missing.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Result};
use gma_core::addr::PortLease;
use gma_core::time::wait_until;

/// `SchedulerParameters` of the generated slurm.conf: they set how soon Slurm looks at a new
/// job, so they dominate every submit-to-start figure measured on this cluster.
pub const SCHEDULER_PARAMETERS: &str = "batch_sched_delay=0,bf_interval=1";

/// A running throw-away cluster.
pub struct Cluster {
    pub dir: tempfile::TempDir,
    /// `SLURM_CONF` of its clients.
    pub conf: PathBuf,
    /// Its first node (also the resource name the adapter offers).
    pub node: String,
    /// All its nodes, in one partition (`debug`).
    pub nodes: Vec<String>,
    /// CPUs of each node.
    pub cpus: u32,
    ctld: Option<Child>,
    slurmd: Vec<Child>,
    munge_sock: PathBuf,
    /// The daemons' ports, kept until the cluster is dropped.
    _ports: Vec<PortLease>,
}

/// The programs the cluster needs.
const PROGRAMS: [&str; 8] = [
    "mungekey",
    "munged",
    "slurmctld",
    "slurmd",
    "scontrol",
    "sbatch",
    "squeue",
    "sinfo",
];

/// Whether `prog` is installed in one of the system bin directories.
pub fn which(prog: &str) -> bool {
    ["/usr/sbin", "/usr/bin", "/sbin", "/bin"]
        .iter()
        .any(|d| Path::new(d).join(prog).is_file())
}

fn run(cmd: &mut Command) -> Result<String> {
    let shown = format!("{cmd:?}");
    let out = cmd.output().map_err(|e| anyhow!("{shown}: {e}"))?;
    if !out.status.success() {
        bail!(
            "{shown} failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim(),
            String::from_utf8_lossy(&out.stdout).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn chmod(p: &Path, mode: u32) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode))
        .map_err(|e| anyhow!("chmod {}: {e}", p.display()))
}

impl Cluster {
    /// Starts a cluster; the error says why it cannot (not installed, not root, a daemon that
    /// would not start, with its log).
    pub fn start() -> Result<Cluster> {
        Cluster::start_nodes(1)
    }

    /// Starts a cluster of `n` nodes (one `slurmd` each, on 127.0.0.1 and ports of their own).
    pub fn start_nodes(n: usize) -> Result<Cluster> {
        if let Some(p) = PROGRAMS.iter().find(|p| !which(p)) {
            bail!(
                "{p} is not installed (scripts/test.sh installs slurmctld slurmd slurm-client munge with apt-get)"
            );
        }
        let uid = run(Command::new("id").arg("-u"))?;
        if uid.trim() != "0" {
            bail!("the throw-away Slurm cluster runs its daemons as root (the sessions and CI run as root)");
        }
        let dir = tempfile::Builder::new()
            .prefix("gma-slurm-")
            .tempdir()
            .map_err(|e| anyhow!("temp dir: {e}"))?;
        let d = dir.path().to_path_buf();
        // slurmctld's port and one per slurmd, kept from other clusters and tests while the
        // cluster lives.
        let ports = gma_core::addr::reserve_ports(n.max(1) + 1)
            .map_err(|e| anyhow!("no ports for the Slurm daemons: {e}"))?;
        let (ctld_port, slurmd_port) = (ports[0].port(), ports[1].port());
        // Node names of its own, so several clusters (tests in parallel) never meet; the first
        // node listens on SlurmdPort, the others on a Port of their own.
        let node = format!("n{ctld_port}");
        let mut nodes = vec![(node.clone(), slurmd_port)];
        for (i, p) in ports.iter().enumerate().skip(2) {
            nodes.push((format!("n{ctld_port}x{}", i - 1), p.port()));
        }
        for sub in ["munge", "run", "state", "log", "jobs"] {
            std::fs::create_dir_all(d.join(sub)).map_err(|e| anyhow!("mkdir {sub}: {e}"))?;
        }
        for (name, _) in &nodes {
            std::fs::create_dir_all(d.join("spool").join(name)).map_err(|e| anyhow!("mkdir spool: {e}"))?;
        }
        // munged: every directory above its socket must be o+x; the key directory stays private.
        chmod(&d, 0o711)?;
        chmod(&d.join("munge"), 0o700)?;
        chmod(&d.join("run"), 0o755)?;
        chmod(&d.join("jobs"), 0o777)?;
        let key = d.join("munge/munge.key");
        let munge_sock = d.join("run/munge.sock");
        run(Command::new("mungekey").arg("-c").arg("-k").arg(&key))?;
        run(Command::new("munged")
            .arg(format!("--key-file={}", key.display()))
            .arg(format!("--socket={}", munge_sock.display()))
            .arg(format!("--pid-file={}", d.join("run/munged.pid").display()))
            .arg(format!("--log-file={}", d.join("munge/munged.log").display()))
            .arg(format!("--seed-file={}", d.join("munge/munged.seed").display())))?;
        let host = run(Command::new("hostname").arg("-s"))?.trim().to_string();
        let conf = d.join("slurm.conf");
        let text = format!(
            "ClusterName=gma{ctld_port}\n\
             SlurmctldHost={host}(127.0.0.1)\n\
             SlurmctldPort={ctld_port}\n\
             SlurmdPort={slurmd_port}\n\
             CommunicationParameters=NoCtldInAddrAny,NoInAddrAny\n\
             SlurmUser=root\nSlurmdUser=root\n\
             AuthType=auth/munge\nAuthInfo=socket={sock}\nCredType=cred/munge\n\
             StateSaveLocation={d}/state\nSlurmdSpoolDir={d}/spool/%n\n\
             SlurmctldPidFile={d}/run/slurmctld.pid\nSlurmdPidFile={d}/run/slurmd-%n.pid\n\
             SlurmctldLogFile={d}/log/slurmctld.log\nSlurmdLogFile={d}/log/slurmd-%n.log\n\
             ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\n\
             SelectType=select/cons_tres\nSelectTypeParameters=CR_Core\n\
             SchedulerType=sched/backfill\nSchedulerParameters={SCHEDULER_PARAMETERS}\n\
             MpiDefault=none\nMailProg=/bin/true\nReturnToService=2\n\
             AccountingStorageType=accounting_storage/none\nJobAcctGatherType=jobacct_gather/none\n\
             JobCompType=jobcomp/none\n{node_lines}\
             PartitionName=debug Nodes={all} Default=YES MaxTime=60 DefaultTime=5 State=UP\n",
            sock = munge_sock.display(),
            d = d.display(),
            node_lines = nodes
                .iter()
                .map(|(name, port)| format!(
                    "NodeName={name} NodeAddr=127.0.0.1 Port={port} CPUs=2 Sockets=1 CoresPerSocket=2 ThreadsPerCore=1 RealMemory=1000 State=UNKNOWN\n"
                ))
                .collect::<String>(),
            all = nodes.iter().map(|(name, _)| name.as_str()).collect::<Vec<_>>().join(","),
        );
        std::fs::write(&conf, text).map_err(|e| anyhow!("write slurm.conf: {e}"))?;
        let log = |name: &str| -> Result<Stdio> {
            std::fs::File::create(d.join("log").join(name))
                .map(Stdio::from)
                .map_err(|e| anyhow!("log {name}: {e}"))
        };
        let mut c = Cluster {
            dir,
            conf: conf.clone(),
            node: node.clone(),
            nodes: nodes.iter().map(|(name, _)| name.clone()).collect(),
            cpus: 2,
            ctld: None,
            slurmd: Vec::new(),
            munge_sock,
            _ports: ports,
        };
        c.ctld = Some(c.spawn_controller()?);
        for (name, _) in &nodes {
            c.slurmd.push(
                Command::new("slurmd")
                    .args(["-D", "-N", name, "-f"])
                    .arg(&conf)
                    .env("SLURM_CONF", &conf)
                    .stdout(log(&format!("slurmd-{name}.out"))?)
                    .stderr(log(&format!("slurmd-{name}.err"))?)
                    .spawn()
                    .map_err(|e| anyhow!("slurmd {name}: {e}"))?,
            );
        }
        let mut last = String::new();
        let up = wait_until(Duration::from_secs(30), || {
            match c.cmd("sinfo", &["-h", "-N", "-o", "%T"]) {
                Ok(s) if s.lines().filter(|l| l.trim() == "idle").count() == nodes.len() => true,
                Ok(s) => {
                    last = format!("sinfo says {:?}", s.trim());
                    false
                }
                Err(e) => {
                    last = e.to_string();
                    false
                }
            }
        });
        if !up {
            bail!(
                "the cluster did not become idle within 30 s ({last}); slurmctld log: {}; slurmd log: {}",
                c.log_tail("slurmctld.log"),
                c.log_tail(&format!("slurmd-{node}.log"))
            );
        }
        Ok(c)
    }

    fn log_tail(&self, name: &str) -> String {
        let text = std::fs::read_to_string(self.dir.path().join("log").join(name)).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(10)..].join("\n")
    }

    /// A directory every job may write to.
    pub fn job_dir(&self) -> PathBuf {
        self.dir.path().join("jobs")
    }

    /// Runs a Slurm client command against this cluster (`TZ=UTC`); its stdout, or the
    /// failure with its stderr.
    pub fn cmd(&self, prog: &str, args: &[&str]) -> Result<String> {
        run(Command::new(prog)
            .args(args)
            .env("SLURM_CONF", &self.conf)
            .env("TZ", "UTC"))
    }

    /// The reservations Slurm holds (`scontrol show reservation -o`, one line each).
    pub fn reservations(&self) -> Result<Vec<String>> {
        Ok(self
            .cmd("scontrol", &["show", "reservation", "-o"])?
            .lines()
            .filter(|l| l.starts_with("ReservationName="))
            .map(String::from)
            .collect())
    }

    /// An adapter config for this cluster (`gma slurm --config`).
    pub fn adapter_config(&self, extra: &str) -> Result<PathBuf> {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let p = self.dir.path().join(format!("adapter-{n}.toml"));
        let text = format!(
            "slurm_conf = \"{}\"\njob_dir = \"{}\"\npoll_ms = 100\n{extra}",
            self.conf.display(),
            self.job_dir().display()
        );
        std::fs::write(&p, text).map_err(|e| anyhow!("write {}: {e}", p.display()))?;
        Ok(p)
    }

    /// Starts slurmctld on this cluster's config (its state directory: what an earlier
    /// slurmctld saved, reservations included, is read back).
    fn spawn_controller(&self) -> Result<Child> {
        let log = |name: &str| {
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(self.dir.path().join("log").join(name))
                .map(Stdio::from)
                .map_err(|e| anyhow!("log {name}: {e}"))
        };
        Command::new("slurmctld")
            .args(["-D", "-f"])
            .arg(&self.conf)
            .env("SLURM_CONF", &self.conf)
            .stdout(log("slurmctld.out")?)
            .stderr(log("slurmctld.err")?)
            .spawn()
            .map_err(|e| anyhow!("slurmctld: {e}"))
    }

    /// Kills slurmctld with SIGKILL (a controller that dies mid-operation) and waits for it.
    pub fn kill_controller(&mut self) {
        if let Some(mut c) = self.ctld.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts slurmctld again (after [`Cluster::kill_controller`] or
    /// [`Cluster::stop_controller`]) with the same state directory, and waits (bounded) until
    /// every node has registered again and can run jobs (no node down, unknown or not
    /// responding).
    pub fn restart_controller(&mut self) -> Result<()> {
        if self.ctld.is_some() {
            bail!("slurmctld is running");
        }
        self.ctld = Some(self.spawn_controller()?);
        let usable = ["idle", "mixed", "allocated", "reserved", "completing", "planned"];
        let mut last = String::new();
        let up = wait_until(Duration::from_secs(60), || {
            match self.cmd("sinfo", &["-h", "-N", "-o", "%T"]) {
                Ok(s) if s.lines().filter(|l| usable.contains(&l.trim())).count() == self.nodes.len() => true,
                Ok(s) => {
                    last = s;
                    false
                }
                Err(e) => {
                    last = e.to_string();
                    false
                }
            }
        });
        if up {
            Ok(())
        } else {
            Err(anyhow!(
                "slurmctld and its nodes did not come back within 60 s (sinfo: {last:?}); its log: {}",
                self.log_tail("slurmctld.log")
            ))
        }
    }

    /// Stops slurmctld (a resource manager that is down); the drop stops the rest.
    pub fn stop_controller(&mut self) {
        if let Some(c) = self.ctld.take() {
            stop_child(c);
        }
    }

    fn stop(&mut self) {
        // Cancel every job and wait (bounded) until the queue is empty.
        if let Ok(ids) = self.cmd("squeue", &["-h", "-o", "%i"]) {
            let ids: Vec<&str> = ids.split_whitespace().collect();
            if !ids.is_empty() {
                let mut args = vec!["--full"];
                args.extend(ids);
                let _ = self.cmd("scancel", &args);
                wait_until(Duration::from_secs(10), || {
                    self.cmd("squeue", &["-h", "-t", "PD,R,CG"])
                        .is_ok_and(|s| s.trim().is_empty())
                });
            }
        }
        for child in self.slurmd.drain(..).chain(self.ctld.take()) {
            stop_child(child);
        }
        // A slurmstepd left behind (a job that ran while the daemons died) ignores SIGTERM:
        // find it by its socket in this cluster's spool and kill it.
        let spool = self.dir.path().join("spool").display().to_string();
        if let Ok(out) = run(Command::new("ss").arg("-xlp")) {
            for line in out.lines().filter(|l| l.contains(&spool)) {
                for pid in line.split("pid=").skip(1) {
                    let pid: String = pid.chars().take_while(char::is_ascii_digit).collect();
                    if !pid.is_empty() {
                        let _ = Command::new("kill").args(["-9", &pid]).status();
                    }
                }
            }
        }
        let _ = Command::new("munged")
            .arg("-s")
            .arg(format!("--socket={}", self.munge_sock.display()))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

fn stop_child(mut child: Child) {
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.stop();
    }
}
