//! `host.auth`: logins and logouts, authentications that succeeded or failed, sudo and password
//! changes on this host — one event per log record (source = host), read from an auth log file
//! or from the systemd journal.
//!
//! Where it reads, decided at the first sample: the configured `auth_log` file; else the journal
//! when the host runs one (`/run/systemd/journal/socket` and `journalctl`); else
//! `/var/log/auth.log` (Debian) or `/var/log/secure` (Red Hat). Without any it is off: it says
//! so once and never looks again. It starts at the end (what was logged before the agent
//! started is not re-reported) and follows: a file by offset (a rotated or truncated file is read
//! again from its start), the journal by cursor (`journalctl -o json --after-cursor`, the auth
//! facilities only).
//!
//! What is recognized (sshd, PAM's `pam_unix`, sudo, passwd), as `kind`:
//! - `auth_success`: `sshd: Accepted <method> for <user> from <ip>`;
//! - `auth_failure`: `sshd: Failed <method> for [invalid user] <user> from <ip>`, `sshd: Invalid
//!   user <user> from <ip>`, `pam_unix(<svc>:auth): authentication failure; … user=<user>`,
//!   `sudo: <user> : N incorrect password attempts`;
//! - `login` / `logout`: `pam_unix(<svc>:session): session opened|closed for user <user>`
//!   (cron's and systemd's own sessions are left out: they are not people);
//! - `sudo`: `sudo: <user> : … USER=<target> ; COMMAND=<program> <args>` — the program only;
//! - `password_change`: `pam_unix(<svc>:chauthtok): password changed for <user>`.
//!
//! Nothing secret is recorded: no password, no command arguments (they may hold one), no
//! message text beyond the fields above. Other records are skipped. Each sample handles at most
//! [`MAX_RECORDS`] records and reads at most [`MAX_READ`] bytes; the rest waits for the next
//! sample (the offset or cursor moves only past what was handled), so a burst is delayed, never
//! dropped. Events carry the sample's time (within one period of the record).

use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::command::{Commands, Ran};
use crate::procfs::{Emit, Files, Probe};
use crate::SensorError;

/// Records handled per sample at most.
pub const MAX_RECORDS: usize = 1000;
/// Bytes of a log file read per sample at most.
pub const MAX_READ: usize = 1 << 20;
/// A line longer than this is skipped (no auth record is that long).
const MAX_LINE: usize = 8192;
/// Journal output kept per sample.
const MAX_JOURNAL_OUTPUT: usize = 8 << 20;
/// Log files tried when none is configured and there is no journal.
pub const AUTH_LOG_PATHS: [&str; 2] = ["/var/log/auth.log", "/var/log/secure"];
/// The journal's socket: its presence says the host runs one.
const JOURNAL_SOCKET: &str = "/run/systemd/journal/socket";
/// PAM services whose sessions are not people's.
const QUIET_SERVICES: [&str; 3] = ["cron", "systemd-user", "CRON"];

/// One recognized record: `host.auth`'s strings, in schema order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthRecord {
    pub kind: &'static str,
    pub user: String,
    /// sshd, sudo, su, login, passwd, ... (the PAM service or the program).
    pub service: String,
    /// The remote address, "" when local.
    pub remote: String,
    /// The auth method (sshd), the target user and program (sudo), or "".
    pub detail: String,
}

/// A user or host name as logged: one word, bounded, printable.
fn word(s: &str) -> Option<String> {
    let w = s.trim().trim_end_matches([';', ',', ':']);
    (!w.is_empty() && w.len() <= 256 && w.chars().all(|c| c.is_ascii_graphic())).then(|| w.to_string())
}

/// The word after `key` in `text` (`for alice from` → after "for " is "alice").
fn after<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    let i = text.find(key)?;
    text[i + key.len()..].split_whitespace().next()
}

/// The `key=value` of a `; `- or space-separated PAM/sudo record.
fn kv<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    text.split([';', ' '])
        .map(str::trim)
        .find_map(|part| part.strip_prefix(key)?.strip_prefix('='))
        .filter(|v| !v.is_empty())
}

/// Recognizes one record of `program` (the syslog identifier: `sshd`, `sudo`, ...) whose text
/// is `message`; `None` for anything else.
pub fn classify(program: &str, message: &str) -> Option<AuthRecord> {
    let rec = |kind, user: &str, service: &str, remote: &str, detail: String| {
        Some(AuthRecord {
            kind,
            user: word(user)?,
            service: word(service).unwrap_or_default(),
            remote: word(remote).unwrap_or_default(),
            detail,
        })
    };
    let m = message.trim();
    // PAM: pam_unix(<service>:<group>): ...
    if let Some(rest) = m.strip_prefix("pam_unix(") {
        let (svc_group, text) = rest.split_once("): ")?;
        let (svc, group) = svc_group.split_once(':')?;
        return match group {
            "session" if QUIET_SERVICES.contains(&svc) => None,
            "session" if text.starts_with("session opened for user ") => {
                let user = after(text, "for user ")?;
                rec("login", user.split('(').next()?, svc, "", String::new())
            }
            "session" if text.starts_with("session closed for user ") => {
                rec("logout", after(text, "for user ")?, svc, "", String::new())
            }
            "auth" if text.starts_with("authentication failure") => {
                let user = kv(text, "user").unwrap_or("");
                let remote = kv(text, "rhost").unwrap_or("");
                rec(
                    "auth_failure",
                    if user.is_empty() { "unknown" } else { user },
                    svc,
                    remote,
                    String::new(),
                )
            }
            "chauthtok" if text.starts_with("password changed for ") => rec(
                "password_change",
                after(text, "password changed for ")?,
                svc,
                "",
                String::new(),
            ),
            _ => None,
        };
    }
    match program {
        "sshd" => {
            if let Some(text) = m.strip_prefix("Accepted ") {
                let method = text.split_whitespace().next().unwrap_or("");
                return rec(
                    "auth_success",
                    after(text, " for ")?,
                    "sshd",
                    after(text, " from ")?,
                    word(method)?,
                );
            }
            if let Some(text) = m.strip_prefix("Failed ") {
                let method = text.split_whitespace().next().unwrap_or("");
                let user = after(text, " for invalid user ").or_else(|| after(text, " for "))?;
                return rec(
                    "auth_failure",
                    user,
                    "sshd",
                    after(text, " from ")?,
                    word(method)?,
                );
            }
            if let Some(text) = m.strip_prefix("Invalid user ") {
                let user = text.split_whitespace().next()?;
                return rec(
                    "auth_failure",
                    user,
                    "sshd",
                    after(text, " from ")?,
                    "invalid user".into(),
                );
            }
            None
        }
        "sudo" => {
            let (user, text) = m.split_once(" : ")?;
            if text.contains("incorrect password attempt") {
                return rec("auth_failure", user, "sudo", "", String::new());
            }
            let target = kv(text, "USER")?;
            // The program only: its arguments may hold a secret.
            let program = text
                .split_once("COMMAND=")
                .and_then(|(_, c)| c.split_whitespace().next())
                .and_then(word)
                .unwrap_or_default();
            rec(
                "sudo",
                user,
                "sudo",
                "",
                format!(
                    "{}{program}",
                    word(target).map(|t| format!("{t} ")).unwrap_or_default()
                ),
            )
        }
        _ => None,
    }
}

/// Splits a syslog line (`<RFC 3339 or "Mmm dd hh:mm:ss"> <host> <program>[pid]: <message>`)
/// into its program and message.
pub fn split_syslog(line: &str) -> Option<(&str, &str)> {
    let mut rest = line.trim_end();
    // The time: one RFC 3339 word, or three words of the classic format.
    let first = rest.split_whitespace().next()?;
    let skip = if first.contains('T') && first.contains(':') {
        1
    } else {
        3
    };
    for _ in 0..skip + 1 {
        // + 1: the host name.
        rest = rest.trim_start();
        let end = rest.find(char::is_whitespace)?;
        rest = &rest[end..];
    }
    let rest = rest.trim_start();
    let (tag, message) = rest.split_once(": ")?;
    let program = tag.split('[').next()?;
    Some((program, message))
}

/// Where the sensor reads.
#[derive(Debug)]
enum From {
    /// Not decided yet (first sample).
    Undecided,
    /// A log file: its path, the open file being followed (`None`: to open — at its end on
    /// the first sample, `started` false; at its start after a rotation).
    File {
        path: PathBuf,
        tail: Option<Tail>,
        started: bool,
    },
    /// The journal, from where it reads next.
    Journal { next: Next },
    /// Nothing to read on this host (said once).
    Off,
}

/// Where the journal is read from next.
#[derive(Debug, Clone, PartialEq)]
enum Next {
    /// The first sample: find the end (the last record's cursor), report nothing.
    End,
    /// The journal had no auth record at the start (Unix seconds): all since then.
    Since(i64),
    /// After this cursor.
    After(String),
}

/// Emits `host.auth`; see the module doc.
pub(crate) struct Auth {
    commands: Commands,
    configured: Option<PathBuf>,
    from: From,
    /// Where the journal's socket is looked for (tests point it elsewhere).
    journal_socket: PathBuf,
}

impl Auth {
    /// Reads `configured` (a log file), else the journal or the usual auth log.
    pub(crate) fn new(commands: Commands, configured: Option<PathBuf>) -> Auth {
        Auth {
            commands,
            configured,
            from: From::Undecided,
            journal_socket: PathBuf::from(JOURNAL_SOCKET),
        }
    }

    #[cfg(test)]
    fn with_journal_socket(mut self, p: &Path) -> Auth {
        self.journal_socket = p.to_path_buf();
        self
    }

    fn decide(&self) -> From {
        if let Some(p) = &self.configured {
            return From::File {
                path: p.clone(),
                tail: None,
                started: false,
            };
        }
        if self.journal_socket.exists() {
            return From::Journal { next: Next::End };
        }
        match AUTH_LOG_PATHS.iter().map(PathBuf::from).find(|p| p.is_file()) {
            Some(path) => From::File {
                path,
                tail: None,
                started: false,
            },
            None => {
                tracing::info!(
                    "host.auth sensor off: no journal and no auth log ({}); set auth_log",
                    AUTH_LOG_PATHS.join(", ")
                );
                From::Off
            }
        }
    }
}

/// A log file being followed: the open file (kept open, so the end of a file rotated away is
/// still read), its inode and the offset handled up to.
#[derive(Debug)]
struct Tail {
    file: std::fs::File,
    ino: u64,
    offset: u64,
}

impl Tail {
    /// Opens `path`, at its end (`at_end`) or its start.
    fn open(path: &Path, at_end: bool) -> Result<Tail, SensorError> {
        let io = |source| SensorError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = std::fs::File::open(path).map_err(io)?;
        let meta = file.metadata().map_err(io)?;
        let offset = if at_end { meta.len() } else { 0 };
        Ok(Tail {
            file,
            ino: meta.ino(),
            offset,
        })
    }

    /// Reads at most [`MAX_READ`] bytes past the offset into `buf` (from the start when the
    /// file was truncated below it).
    fn read(&mut self, path: &Path, buf: &mut Vec<u8>) -> Result<(), SensorError> {
        let io = |source| SensorError::Io {
            path: path.to_path_buf(),
            source,
        };
        if self.file.metadata().map_err(io)?.len() < self.offset {
            self.offset = 0;
        }
        buf.clear();
        self.file.seek(SeekFrom::Start(self.offset)).map_err(io)?;
        (&self.file).take(MAX_READ as u64).read_to_end(buf).map_err(io)?;
        Ok(())
    }
}

/// The records in `buf`'s complete lines (a final line without its end too when `last`: a
/// file rotated away gets no more), at most [`MAX_RECORDS`]; and the bytes handled.
fn records_in(buf: &[u8], last: bool, out: &mut Emit<'_>) -> usize {
    let mut used = 0usize;
    let mut records = 0usize;
    for line in buf.split_inclusive(|b| *b == b'\n') {
        if (!line.ends_with(b"\n") && !last) || records >= MAX_RECORDS {
            break; // a partial line waits for its end; the rest for the next sample
        }
        used += line.len();
        if line.len() > MAX_LINE {
            continue;
        }
        let text = String::from_utf8_lossy(line);
        if let Some(r) = split_syslog(&text).and_then(|(p, m)| classify(p, m)) {
            push(out, r);
            records += 1;
        }
    }
    // A full buffer without a line end: one over-long line, skipped.
    if used == 0 && buf.len() >= MAX_READ {
        used = buf.len();
    }
    used
}

impl Auth {
    fn sample_file(&mut self, out: &mut Emit<'_>) -> Result<(), SensorError> {
        let From::File { path, tail, started } = &mut self.from else {
            return Ok(());
        };
        // Twice at most: the end of a file rotated away, then the new one.
        for _ in 0..2 {
            let t = match tail {
                Some(t) => t,
                None => {
                    // The first time at the end (nothing of the past); after a rotation from
                    // the start.
                    let first = !*started;
                    let t = tail.insert(Tail::open(path, first)?);
                    *started = true;
                    if first {
                        return Ok(());
                    }
                    t
                }
            };
            // Rotated away (the path is another file now, or gone): this file gets no more.
            let rotated = std::fs::metadata(&*path).map_or(true, |m| m.ino() != t.ino);
            let mut buf = Vec::new();
            t.read(path, &mut buf)?;
            let done = buf.len() < MAX_READ;
            let used = records_in(&buf, rotated && done, out);
            t.offset += used as u64;
            if !(rotated && done && used == buf.len()) {
                break;
            }
            // Finished with the old file: the new one, from its start.
            *tail = None;
        }
        Ok(())
    }

    fn sample_journal(&mut self, out: &mut Emit<'_>) -> Result<(), SensorError> {
        let From::Journal { next } = &mut self.from else {
            return Ok(());
        };
        let from;
        let mut args = vec!["-q", "-o", "json", "--no-pager"];
        match next {
            Next::End => args.extend(["-n", "1"]),
            Next::Since(s) => {
                from = format!("--since=@{s}");
                args.push(&from);
            }
            Next::After(c) => {
                from = format!("--after-cursor={c}");
                args.push(&from);
            }
        }
        // The auth facilities (4 auth, 10 authpriv).
        args.extend(["SYSLOG_FACILITY=4", "SYSLOG_FACILITY=10"]);
        let (program, ran) = self.commands.run("journalctl", &args, &[], MAX_JOURNAL_OUTPUT);
        let o = match ran? {
            Ran::Missing => {
                tracing::info!(
                    "host.auth sensor off: the host runs a journal but journalctl is not installed"
                );
                self.from = From::Off;
                return Ok(());
            }
            Ran::Done(o) => o.succeeded(&program)?,
        };
        let at_end = *next == Next::End;
        let mut last = None;
        let mut records = 0usize;
        let lines: Vec<&str> = o.stdout.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            // Output cut at its bound: the last line may be partial; it is read next time.
            if o.truncated && i + 1 == lines.len() {
                break;
            }
            let v: serde_json::Value = serde_json::from_str(line)
                .map_err(|e| SensorError::parse("journalctl -o json", i + 1, e.to_string()))?;
            let program = v["SYSLOG_IDENTIFIER"]
                .as_str()
                .or(v["_COMM"].as_str())
                .unwrap_or("");
            let record = v["MESSAGE"].as_str().and_then(|m| classify(program, m));
            if !at_end {
                if let Some(r) = record {
                    if records == MAX_RECORDS {
                        break; // the rest next time, after the last one handled
                    }
                    push(out, r);
                    records += 1;
                }
            }
            if let Some(c) = v["__CURSOR"].as_str() {
                last = Some(c.to_string());
            }
        }
        match last {
            Some(c) => *next = Next::After(c),
            // No auth record at all yet: everything from now on.
            None if at_end => *next = Next::Since(out.now_ns / 1_000_000_000),
            None => {}
        }
        Ok(())
    }
}

fn push(out: &mut Emit<'_>, r: AuthRecord) {
    out.push(
        vec![],
        vec![r.kind.to_string(), r.user, r.service, r.remote, r.detail],
    );
}

impl Probe for Auth {
    /// Off (no journal, no auth log): nothing to run, nothing to wait for.
    fn blocking(&self) -> bool {
        !matches!(self.from, From::Off)
    }

    fn sample(&mut self, _files: &mut Files, out: &mut Emit<'_>) -> Result<(), SensorError> {
        if matches!(self.from, From::Undecided) {
            self.from = self.decide();
        }
        match self.from {
            From::File { .. } => self.sample_file(out),
            From::Journal { .. } => self.sample_journal(out),
            From::Off | From::Undecided => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Sensor;
    use std::io::Write;
    use std::time::Duration;

    fn rec(kind: &'static str, user: &str, service: &str, remote: &str, detail: &str) -> Option<AuthRecord> {
        Some(AuthRecord {
            kind,
            user: user.into(),
            service: service.into(),
            remote: remote.into(),
            detail: detail.into(),
        })
    }

    #[test]
    fn recognizes_the_records_and_keeps_no_secret() {
        let cases = [
            ("sshd", "Accepted publickey for alice from 10.1.2.3 port 50522 ssh2: ED25519 SHA256:x",
             rec("auth_success", "alice", "sshd", "10.1.2.3", "publickey")),
            ("sshd", "Failed password for invalid user admin from 203.0.113.9 port 4242 ssh2",
             rec("auth_failure", "admin", "sshd", "203.0.113.9", "password")),
            ("sshd", "Failed password for bob from 203.0.113.9 port 4242 ssh2",
             rec("auth_failure", "bob", "sshd", "203.0.113.9", "password")),
            ("sshd", "Invalid user oracle from 198.51.100.7 port 2222",
             rec("auth_failure", "oracle", "sshd", "198.51.100.7", "invalid user")),
            ("sshd", "pam_unix(sshd:session): session opened for user alice(uid=1000) by (uid=0)",
             rec("login", "alice", "sshd", "", "")),
            ("sshd", "pam_unix(sshd:session): session closed for user alice",
             rec("logout", "alice", "sshd", "", "")),
            ("su", "pam_unix(su:auth): authentication failure; logname=bob uid=1001 euid=0 tty=/dev/pts/0 ruser=bob rhost=  user=root",
             rec("auth_failure", "root", "su", "", "")),
            ("sudo", "    bob : TTY=pts/0 ; PWD=/home/bob ; USER=root ; COMMAND=/usr/bin/mysql -psecret",
             rec("sudo", "bob", "sudo", "", "root /usr/bin/mysql")),
            ("sudo", "bob : 3 incorrect password attempts ; TTY=pts/0 ; PWD=/home/bob ; USER=root ; COMMAND=/bin/ls",
             rec("auth_failure", "bob", "sudo", "", "")),
            ("passwd", "pam_unix(passwd:chauthtok): password changed for carol",
             rec("password_change", "carol", "passwd", "", "")),
            ("CRON", "pam_unix(cron:session): session opened for user root(uid=0) by (uid=0)", None),
            ("sshd", "Received disconnect from 10.1.2.3 port 50522:11: disconnected by user", None),
            ("kernel", "Accepted publickey for alice from 10.1.2.3", None),
            ("sshd", "Accepted publickey for from", None),
        ];
        for (program, message, want) in cases {
            assert_eq!(classify(program, message), want, "{program}: {message}");
        }
        let sudo = classify(
            "sudo",
            "bob : TTY=pts/0 ; PWD=/ ; USER=root ; COMMAND=/usr/bin/mysql -psecret",
        )
        .unwrap();
        assert!(!format!("{sudo:?}").contains("secret"));
    }

    #[test]
    fn splits_both_syslog_time_formats() {
        assert_eq!(
            split_syslog("2026-11-26T22:03:06.123456+00:00 vm sshd[123]: Accepted x for a from b"),
            Some(("sshd", "Accepted x for a from b"))
        );
        assert_eq!(
            split_syslog("Nov 26 22:03:06 vm sudo:     bob : TTY=pts/0"),
            Some(("sudo", "    bob : TTY=pts/0"))
        );
        assert_eq!(split_syslog("garbage"), None);
    }

    fn sensor(auth: Auth) -> impl Sensor {
        crate::procfs::ProcSensor::new(
            "h",
            Duration::from_secs(1),
            Path::new("/proc"),
            crate::schemas::host_auth(),
            auth,
        )
    }

    fn commands(dir: Option<&Path>) -> Commands {
        Commands {
            bin_dir: dir.map(Path::to_path_buf),
            timeout: Duration::from_secs(10),
        }
    }

    fn kinds(out: &[gma_core::event::EventData]) -> Vec<(String, String)> {
        out.iter()
            .map(|e| (e.strings[0].clone(), e.strings[1].clone()))
            .collect()
    }

    #[test]
    fn follows_a_file_through_partial_lines_rotation_and_truncation() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("auth.log");
        let line = |user: &str| {
            format!("Nov 26 22:03:06 vm sshd[1]: Accepted password for {user} from 10.0.0.1 port 1 ssh2\n")
        };
        std::fs::write(&log, line("before")).unwrap();
        let mut s = sensor(Auth::new(commands(None), Some(log.clone())));
        let mut out = Vec::new();
        s.sample(1, &mut out).unwrap();
        assert!(out.is_empty(), "what was there at the start is not re-reported");
        let mut f = std::fs::OpenOptions::new().append(true).open(&log).unwrap();
        f.write_all(line("a").as_bytes()).unwrap();
        let half = line("b");
        f.write_all(&half.as_bytes()[..20]).unwrap();
        s.sample(2, &mut out).unwrap();
        assert_eq!(kinds(&out), [("auth_success".into(), "a".into())]);
        f.write_all(&half.as_bytes()[20..]).unwrap();
        out.clear();
        s.sample(3, &mut out).unwrap();
        assert_eq!(
            kinds(&out),
            [("auth_success".into(), "b".into())],
            "the partial line, once whole"
        );
        // Rotated: a new file in its place, read from its start.
        std::fs::rename(&log, dir.path().join("auth.log.1")).unwrap();
        std::fs::write(&log, line("c")).unwrap();
        out.clear();
        s.sample(4, &mut out).unwrap();
        assert_eq!(kinds(&out), [("auth_success".into(), "c".into())]);
        // Truncated in place: from the start again.
        std::fs::write(&log, "").unwrap();
        s.sample(5, &mut out).unwrap();
        std::fs::write(&log, line("d")).unwrap();
        out.clear();
        s.sample(6, &mut out).unwrap();
        assert_eq!(kinds(&out), [("auth_success".into(), "d".into())]);
        // A burst: at most MAX_RECORDS a sample, the rest next time, nothing lost.
        let burst: String = (0..MAX_RECORDS + 5).map(|i| line(&format!("u{i}"))).collect();
        std::fs::OpenOptions::new()
            .append(true)
            .open(&log)
            .unwrap()
            .write_all(burst.as_bytes())
            .unwrap();
        out.clear();
        s.sample(7, &mut out).unwrap();
        assert_eq!(out.len(), MAX_RECORDS);
        out.clear();
        s.sample(8, &mut out).unwrap();
        assert_eq!(out.len(), 5);
        assert_eq!(out[4].strings[1], format!("u{}", MAX_RECORDS + 4));
        // A missing file is a sample error, not a panic.
        std::fs::remove_file(&log).unwrap();
        assert!(s.sample(9, &mut out).is_err());
    }

    #[test]
    fn reads_the_journal_after_its_cursor() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path();
        let socket = p.join("journal.socket");
        std::fs::write(&socket, "").unwrap();
        // A fake journalctl: the last record at the start, then two new ones after cursor c1.
        let script = p.join("journalctl");
        std::fs::write(
            &script,
            format!(
                "#!/bin/sh\necho \"$@\" >> '{}'\ncase \"$*\" in\n\
                 *after-cursor=c1*) printf '%s\\n%s\\n' \
                 '{{\"__CURSOR\":\"c2\",\"SYSLOG_IDENTIFIER\":\"sshd\",\"MESSAGE\":\"Accepted publickey for alice from 10.0.0.2 port 1 ssh2\"}}' \
                 '{{\"__CURSOR\":\"c3\",\"SYSLOG_IDENTIFIER\":\"sshd\",\"MESSAGE\":\"Connection closed\"}}' ;;\n\
                 *after-cursor=c3*) ;;\n\
                 *) echo '{{\"__CURSOR\":\"c1\",\"SYSLOG_IDENTIFIER\":\"sshd\",\"MESSAGE\":\"Accepted publickey for old from 10.0.0.9 port 1 ssh2\"}}' ;;\n\
                 esac\n",
                p.join("args").display()
            ),
        )
        .unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        let mut s = sensor(Auth::new(commands(Some(p)), None).with_journal_socket(&socket));
        let mut out = Vec::new();
        s.sample(1, &mut out).unwrap();
        assert!(out.is_empty(), "the journal's past is not re-reported");
        s.sample(2, &mut out).unwrap();
        assert_eq!(kinds(&out), [("auth_success".into(), "alice".into())]);
        out.clear();
        s.sample(3, &mut out).unwrap();
        assert!(out.is_empty());
        let args = std::fs::read_to_string(p.join("args")).unwrap();
        assert!(args.contains("--after-cursor=c3"), "{args}");
        assert!(args.lines().all(|l| l.contains("SYSLOG_FACILITY=10")), "{args}");
    }

    #[test]
    fn off_without_journal_or_log() {
        let dir = tempfile::tempdir().unwrap();
        let a = Auth::new(commands(None), None).with_journal_socket(&dir.path().join("none"));
        // This machine may have /var/log/auth.log; only its absence means Off.
        let off = AUTH_LOG_PATHS.iter().all(|p| !Path::new(p).is_file());
        assert_eq!(matches!(a.decide(), From::Off), off);
    }
}
