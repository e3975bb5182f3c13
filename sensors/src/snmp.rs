//! `net.snmp.*`: network devices (routers, switches, any SNMP agent) polled over SNMPv2c or
//! SNMPv3 (authPriv) with the `snmp2` crate.
//!
//! Every poll of a device reads `sysUpTime.0`, walks `ifName` (IF-MIB ifXTable) with GETBULK,
//! then for each interface GETs, in one request, `sysUpTime.0`, `ifHCInOctets`,
//! `ifHCOutOctets`, `ifHCInUcastPkts`, `ifHCOutUcastPkts`, `ifHighSpeed`, `ifOperStatus` and
//! `ifDescr`. It emits:
//!
//! - `net.snmp.if` (source `<device>/<ifName>`): bytes and packets per second in and out over
//!   the time between this poll and the last, the link speed, the operational status and the
//!   counters themselves. An interface's first sighting is its baseline (no event).
//! - `net.snmp.device` (source `<device>`): one per poll: `ok`, `unreachable` (no answer within
//!   the timeout and retries), `auth_failed` (SNMPv3 credentials refused) or `error`, with the
//!   reason. A device that does not answer never holds the sensor longer than
//!   `timeout_ms * (retries + 1)` per request, and the other devices are polled as usual.
//! - `net.snmp.change` (source `<device>` or `<device>/<ifName>`): `restarted` when `sysUpTime`
//!   went back (the agent restarted: every interface re-baselines, no rate is computed across
//!   it), `oper_status` when an interface's `ifOperStatus` changes, `counter_reset` when a
//!   64-bit counter went back without a restart (a discontinuity: that interval has no rate).
//!
//! A 64-bit counter that went back from its upper half is taken as a wrap (the delta is
//! computed modulo 2^64); from lower down it is a discontinuity. `sysUpTime` wraps after 497
//! days: a decrease from the last hour before 2^32 ticks to the first hour after is a wrap.
//!
//! Credentials (communities, SNMPv3 passwords) are held in [`Secret`], whose `Debug` prints
//! `<redacted>`, and appear in no event, log line or error.

use std::collections::BTreeMap;
use std::fmt;
use std::time::{Duration, Instant};

use gma_core::event::{dbl, schema, text};
use gma_proto::v1::EventSchema;
use serde::Deserialize;
use snmp2::{Oid, SyncSession, Value};

use crate::{EventData, Sensor, SensorError};

pub const NET_SNMP_IF: &str = "net.snmp.if";
pub const NET_SNMP_DEVICE: &str = "net.snmp.device";
pub const NET_SNMP_CHANGE: &str = "net.snmp.change";
/// The sensor's name (for `sensor_period_ms`).
pub const SENSOR_NAME: &str = "net.snmp";

/// Most devices one sensor polls.
pub const MAX_DEVICES: usize = 256;
/// Most interfaces read per device (beyond, the walk stops).
pub const MAX_INTERFACES: usize = 1024;
/// Longest name, address, user or secret accepted in the config.
const MAX_TEXT: usize = 256;
/// Longest per-request timeout, and most retries.
const MAX_TIMEOUT_MS: u64 = 60_000;
const MAX_RETRIES: u32 = 10;
/// GETBULK max-repetitions while walking `ifName`.
const BULK: u32 = 32;

/// The MIB objects read, as their numeric OIDs (no MIB files needed).
pub mod oids {
    /// SNMPv2-MIB::sysUpTime.0 (TimeTicks, hundredths of a second).
    pub const SYS_UPTIME: &[u64] = &[1, 3, 6, 1, 2, 1, 1, 3, 0];
    /// IF-MIB::ifDescr.
    pub const IF_DESCR: &[u64] = &[1, 3, 6, 1, 2, 1, 2, 2, 1, 2];
    /// IF-MIB::ifOperStatus (1 up, 2 down, 3 testing, 4 unknown, 5 dormant, 6 notPresent,
    /// 7 lowerLayerDown).
    pub const IF_OPER_STATUS: &[u64] = &[1, 3, 6, 1, 2, 1, 2, 2, 1, 8];
    /// IF-MIB::ifName.
    pub const IF_NAME: &[u64] = &[1, 3, 6, 1, 2, 1, 31, 1, 1, 1, 1];
    pub const IF_HC_IN_OCTETS: &[u64] = &[1, 3, 6, 1, 2, 1, 31, 1, 1, 1, 6];
    pub const IF_HC_IN_UCAST_PKTS: &[u64] = &[1, 3, 6, 1, 2, 1, 31, 1, 1, 1, 7];
    pub const IF_HC_OUT_OCTETS: &[u64] = &[1, 3, 6, 1, 2, 1, 31, 1, 1, 1, 10];
    pub const IF_HC_OUT_UCAST_PKTS: &[u64] = &[1, 3, 6, 1, 2, 1, 31, 1, 1, 1, 11];
    /// IF-MIB::ifHighSpeed (Mbit/s).
    pub const IF_HIGH_SPEED: &[u64] = &[1, 3, 6, 1, 2, 1, 31, 1, 1, 1, 15];
}

/// The statistics read from every device, as published in the directory.
pub const STATISTICS: &str = "sysUpTime,ifName,ifDescr,ifHCInOctets,ifHCOutOctets,ifHCInUcastPkts,ifHCOutUcastPkts,ifHighSpeed,ifOperStatus";

/// A credential: deserialized from a string, never printed.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    pub fn new(s: impl Into<String>) -> Secret {
        Secret(s.into())
    }

    fn bytes(&self) -> &[u8] {
        self.0.as_bytes()
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// One `[[snmp]]` table of the producer config.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnmpDevice {
    /// The device's name: the source of its events (`<name>`, `<name>/<ifName>`).
    pub name: String,
    /// `host:port` of the agent (UDP), e.g. `192.0.2.1:161`.
    pub address: String,
    /// `"2c"` (default) or `"3"`.
    #[serde(default = "default_version")]
    pub version: String,
    /// SNMPv2c community.
    #[serde(default)]
    pub community: Option<Secret>,
    /// SNMPv3 user (security name).
    #[serde(default)]
    pub user: Option<String>,
    /// SNMPv3 authentication: `SHA` (SHA-1, default), `SHA-224`, `SHA-256`, `SHA-384`,
    /// `SHA-512` or `MD5`.
    #[serde(default)]
    pub auth_protocol: Option<String>,
    #[serde(default)]
    pub auth_password: Option<Secret>,
    /// SNMPv3 privacy: `AES` (AES-128, default), `AES-192`, `AES-256` or `DES`.
    #[serde(default)]
    pub priv_protocol: Option<String>,
    #[serde(default)]
    pub priv_password: Option<Secret>,
    /// Per-request timeout. Default 1000 ms.
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: u64,
    /// Retries after a request timed out. Default 1.
    #[serde(default = "default_retries")]
    pub retries: u32,
    /// Only these `ifName`s; empty (default) = every interface.
    #[serde(default)]
    pub interfaces: Vec<String>,
}

fn default_version() -> String {
    "2c".to_string()
}

fn default_timeout_ms() -> u64 {
    1000
}

fn default_retries() -> u32 {
    1
}

impl SnmpDevice {
    /// A v2c device with the defaults.
    pub fn v2c(name: &str, address: &str, community: &str) -> SnmpDevice {
        SnmpDevice {
            name: name.to_string(),
            address: address.to_string(),
            version: "2c".to_string(),
            community: Some(Secret::new(community)),
            user: None,
            auth_protocol: None,
            auth_password: None,
            priv_protocol: None,
            priv_password: None,
            timeout_ms: default_timeout_ms(),
            retries: default_retries(),
            interfaces: Vec::new(),
        }
    }

    /// A v3 authPriv device with the defaults (SHA, AES).
    pub fn v3(name: &str, address: &str, user: &str, auth_password: &str, priv_password: &str) -> SnmpDevice {
        SnmpDevice {
            version: "3".to_string(),
            community: None,
            user: Some(user.to_string()),
            auth_password: Some(Secret::new(auth_password)),
            priv_password: Some(Secret::new(priv_password)),
            ..SnmpDevice::v2c(name, address, "")
        }
    }

    /// `"v2c"` or `"v3"`, for events and the directory.
    pub fn version_label(&self) -> &'static str {
        if self.version == "3" {
            "v3"
        } else {
            "v2c"
        }
    }

    /// Checks the table; the error names the device and what to fix (never a secret).
    pub fn validate(&self) -> Result<(), SensorError> {
        self.credentials().map(|_| ())
    }

    fn credentials(&self) -> Result<Credentials, SensorError> {
        let bad = |m: String| SensorError::config("[[snmp]]", format!("device {:?}: {m}", self.name));
        gma_core::pattern::validate_source(&self.name).map_err(|e| bad(format!("name: {e}")))?;
        if self.address.is_empty() || self.address.len() > MAX_TEXT || !self.address.contains(':') {
            return Err(bad("address must be host:port (e.g. 192.0.2.1:161)".into()));
        }
        if self.timeout_ms == 0 || self.timeout_ms > MAX_TIMEOUT_MS {
            return Err(bad(format!("timeout_ms must be within 1..={MAX_TIMEOUT_MS}")));
        }
        if self.retries > MAX_RETRIES {
            return Err(bad(format!("retries must be within 0..={MAX_RETRIES}")));
        }
        if self.interfaces.iter().any(|i| i.is_empty() || i.len() > MAX_TEXT) {
            return Err(bad("interfaces must be non-empty ifNames".into()));
        }
        let long = |s: &Option<Secret>| s.as_ref().is_some_and(|s| s.0.len() > MAX_TEXT);
        if long(&self.community) || long(&self.auth_password) || long(&self.priv_password) {
            return Err(bad(format!(
                "a community or password is longer than {MAX_TEXT} bytes"
            )));
        }
        match self.version.as_str() {
            "2c" => {
                if self.user.is_some() || self.auth_password.is_some() || self.priv_password.is_some() {
                    return Err(bad(
                        "user and passwords are for version \"3\"; v2c takes community".into(),
                    ));
                }
                let c = self
                    .community
                    .clone()
                    .filter(|c| !c.0.is_empty())
                    .ok_or_else(|| bad("version \"2c\" needs a community".into()))?;
                Ok(Credentials::V2c(c))
            }
            "3" => {
                if self.community.is_some() {
                    return Err(bad(
                        "community is for version \"2c\"; v3 takes user and passwords".into(),
                    ));
                }
                let user = self
                    .user
                    .clone()
                    .filter(|u| !u.is_empty() && u.len() <= MAX_TEXT)
                    .ok_or_else(|| bad("version \"3\" needs a user".into()))?;
                // RFC 3414: passwords shorter than 8 characters are refused by agents.
                let pw = |p: &Option<Secret>, what: &str| {
                    p.clone().filter(|p| p.0.len() >= 8).ok_or_else(|| {
                        bad(format!(
                            "version \"3\" needs {what} of at least 8 characters (authPriv)"
                        ))
                    })
                };
                let auth = match self.auth_protocol.as_deref().unwrap_or("SHA") {
                    "MD5" => snmp2::v3::AuthProtocol::Md5,
                    "SHA" | "SHA-1" | "SHA1" => snmp2::v3::AuthProtocol::Sha1,
                    "SHA-224" => snmp2::v3::AuthProtocol::Sha224,
                    "SHA-256" => snmp2::v3::AuthProtocol::Sha256,
                    "SHA-384" => snmp2::v3::AuthProtocol::Sha384,
                    "SHA-512" => snmp2::v3::AuthProtocol::Sha512,
                    other => {
                        return Err(bad(format!(
                        "auth_protocol {other:?} is not one of SHA, SHA-224, SHA-256, SHA-384, SHA-512, MD5"
                    )))
                    }
                };
                let cipher = match self.priv_protocol.as_deref().unwrap_or("AES") {
                    "AES" | "AES-128" => snmp2::v3::Cipher::Aes128,
                    "AES-192" => snmp2::v3::Cipher::Aes192,
                    "AES-256" => snmp2::v3::Cipher::Aes256,
                    "DES" => snmp2::v3::Cipher::Des,
                    other => {
                        return Err(bad(format!(
                            "priv_protocol {other:?} is not one of AES, AES-192, AES-256, DES"
                        )))
                    }
                };
                if cipher.priv_key_needs_extension(&auth) {
                    return Err(bad(format!(
                        "{} keys are too short for {}: use SHA-256 or stronger",
                        self.auth_protocol.as_deref().unwrap_or("SHA"),
                        self.priv_protocol.as_deref().unwrap_or("AES")
                    )));
                }
                Ok(Credentials::V3 {
                    user,
                    auth,
                    auth_password: pw(&self.auth_password, "auth_password")?,
                    cipher,
                    priv_password: pw(&self.priv_password, "priv_password")?,
                })
            }
            other => Err(bad(format!("version {other:?} must be \"2c\" or \"3\""))),
        }
    }
}

/// Checks a device list (names unique, at most [`MAX_DEVICES`], each valid).
pub fn validate_devices(devices: &[SnmpDevice]) -> Result<(), SensorError> {
    if devices.len() > MAX_DEVICES {
        return Err(SensorError::config(
            "[[snmp]]",
            format!("{} devices, at most {MAX_DEVICES}", devices.len()),
        ));
    }
    let mut seen = std::collections::BTreeSet::new();
    for d in devices {
        d.validate()?;
        if !seen.insert(d.name.as_str()) {
            return Err(SensorError::config(
                "[[snmp]]",
                format!("device name {:?} appears twice", d.name),
            ));
        }
    }
    Ok(())
}

/// The directory attributes describing what the sensor polls: `snmp.devices` (names),
/// `snmp.device.<name>` (`<address> <version>`) and `snmp.statistics`.
pub fn directory_attributes(devices: &[SnmpDevice]) -> BTreeMap<String, String> {
    let mut a = BTreeMap::new();
    if devices.is_empty() {
        return a;
    }
    let names: Vec<&str> = devices.iter().map(|d| d.name.as_str()).collect();
    a.insert("snmp.devices".to_string(), names.join(","));
    for d in devices {
        a.insert(
            format!("snmp.device.{}", d.name),
            format!("{} {}", d.address, d.version_label()),
        );
    }
    a.insert("snmp.statistics".to_string(), STATISTICS.to_string());
    a
}

#[derive(Clone)]
enum Credentials {
    V2c(Secret),
    V3 {
        user: String,
        auth: snmp2::v3::AuthProtocol,
        auth_password: Secret,
        cipher: snmp2::v3::Cipher,
        priv_password: Secret,
    },
}

/// `net.snmp.if`.
pub fn net_snmp_if() -> EventSchema {
    schema(
        NET_SNMP_IF,
        "an interface of an SNMP device: rates over the last poll (IF-MIB 64-bit counters)",
        vec![
            dbl(
                "in_bytes_per_s",
                "B/s",
                "ifHCInOctets delta over the poll interval",
            ),
            dbl(
                "out_bytes_per_s",
                "B/s",
                "ifHCOutOctets delta over the poll interval",
            ),
            dbl(
                "in_pkts_per_s",
                "1/s",
                "ifHCInUcastPkts delta over the poll interval",
            ),
            dbl(
                "out_pkts_per_s",
                "1/s",
                "ifHCOutUcastPkts delta over the poll interval",
            ),
            dbl("speed_mbps", "Mbit/s", "ifHighSpeed"),
            dbl(
                "oper_status",
                "",
                "ifOperStatus: 1 up, 2 down, 3 testing, 4 unknown, 5 dormant, 6 notPresent, 7 lowerLayerDown",
            ),
            dbl("in_octets", "B", "ifHCInOctets as read"),
            dbl("out_octets", "B", "ifHCOutOctets as read"),
            text("device", "the device's configured name"),
            text("if_name", "ifName"),
            text("if_descr", "ifDescr"),
        ],
    )
}

/// `net.snmp.device`.
pub fn net_snmp_device() -> EventSchema {
    schema(
        NET_SNMP_DEVICE,
        "one poll of an SNMP device: whether it answered, its uptime and interfaces",
        vec![
            dbl("up", "", "1 when the device answered this poll, else 0"),
            dbl("uptime_s", "s", "sysUpTime (0 when it did not answer)"),
            dbl("interfaces", "", "interfaces read"),
            dbl("poll_ms", "ms", "time the poll took"),
            text("device", "the device's configured name"),
            text("address", "host:port polled"),
            text("version", "v2c or v3"),
            text("state", "ok, unreachable, auth_failed or error"),
            text("detail", "why, when not ok (never a credential)"),
        ],
    )
}

/// `net.snmp.change`.
pub fn net_snmp_change() -> EventSchema {
    schema(
        NET_SNMP_CHANGE,
        "a change seen on an SNMP device: restart, interface status, counter discontinuity",
        vec![
            text("device", "the device's configured name"),
            text("kind", "restarted, oper_status or counter_reset"),
            text("if_name", "the interface (\"\" for restarted)"),
            text("before", "the value before (sysUpTime in s, or the old status)"),
            text("after", "the value now"),
        ],
    )
}

/// Counters of one interface at one poll.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct IfCounters {
    pub in_octets: u64,
    pub out_octets: u64,
    pub in_pkts: u64,
    pub out_pkts: u64,
}

/// The increase of a 64-bit counter, or `None` for a discontinuity (it went back from below
/// its upper half: no wrap can explain that at any real rate).
pub fn counter_delta(prev: u64, cur: u64) -> Option<u64> {
    if cur >= prev {
        Some(cur - prev)
    } else if prev >= 1 << 63 {
        Some(cur.wrapping_sub(prev))
    } else {
        None
    }
}

/// Ticks in an hour (sysUpTime is in hundredths of a second).
const HOUR_TICKS: u32 = 360_000;

/// Whether `sysUpTime` going from `prev` to `cur` means the agent restarted (it went back, and
/// not by wrapping past 2^32 ticks).
pub fn restarted(prev: u32, cur: u32) -> bool {
    cur < prev && !(prev > u32::MAX - HOUR_TICKS && cur < HOUR_TICKS)
}

/// The `net.snmp.if` rates from `prev` to `cur` over `dt_s`: `None` when a counter is
/// discontinuous.
pub fn if_rates(prev: &IfCounters, cur: &IfCounters, dt_s: f64) -> Option<[f64; 4]> {
    let d = [
        counter_delta(prev.in_octets, cur.in_octets)?,
        counter_delta(prev.out_octets, cur.out_octets)?,
        counter_delta(prev.in_pkts, cur.in_pkts)?,
        counter_delta(prev.out_pkts, cur.out_pkts)?,
    ];
    Some(d.map(|x| x as f64 / dt_s))
}

/// Why a poll failed.
#[derive(Debug)]
enum PollError {
    Unreachable(String),
    Auth(String),
    Other(String),
}

impl PollError {
    fn state(&self) -> &'static str {
        match self {
            PollError::Unreachable(_) => "unreachable",
            PollError::Auth(_) => "auth_failed",
            PollError::Other(_) => "error",
        }
    }

    fn detail(&self) -> &str {
        match self {
            PollError::Unreachable(s) | PollError::Auth(s) | PollError::Other(s) => s,
        }
    }
}

fn classify(e: snmp2::Error, what: &str, timeout: Duration, tries: u32) -> PollError {
    match e {
        snmp2::Error::Receive | snmp2::Error::Send => PollError::Unreachable(format!(
            "no answer to {what} within {} ms per try, {tries} tries (agent down, wrong address, or wrong community)",
            timeout.as_millis()
        )),
        snmp2::Error::AuthFailure(k) => PollError::Auth(format!(
            "SNMPv3 authentication failed ({k}): check user, protocols and passwords"
        )),
        other => PollError::Other(format!("{what}: {other}")),
    }
}

/// One interface as last read.
#[derive(Debug, Clone)]
struct IfState {
    counters: IfCounters,
    oper: i64,
    at_ns: i64,
}

/// One interface read at a poll.
#[derive(Debug, Clone)]
struct IfRead {
    name: String,
    descr: String,
    counters: IfCounters,
    speed_mbps: f64,
    oper: i64,
}

struct Device {
    cfg: SnmpDevice,
    creds: Credentials,
    session: Option<SyncSession>,
    req_id: i32,
    uptime: Option<u32>,
    ifaces: BTreeMap<String, IfState>,
}

impl Device {
    fn open(&mut self) -> Result<&mut SyncSession, PollError> {
        if self.session.is_none() {
            let timeout = Some(Duration::from_millis(self.cfg.timeout_ms));
            self.req_id = self.req_id.wrapping_add(1_000_000);
            let io = |e: std::io::Error| {
                PollError::Other(format!("cannot open a socket to {}: {e}", self.cfg.address))
            };
            let s = match &self.creds {
                Credentials::V2c(c) => {
                    SyncSession::new_v2c(&self.cfg.address, c.bytes(), timeout, self.req_id).map_err(io)?
                }
                Credentials::V3 {
                    user,
                    auth,
                    auth_password,
                    cipher,
                    priv_password,
                } => {
                    let sec = snmp2::v3::Security::new(user.as_bytes(), auth_password.bytes())
                        .with_auth_protocol(*auth)
                        .with_auth(snmp2::v3::Auth::AuthPriv {
                            cipher: *cipher,
                            privacy_password: priv_password.bytes().to_vec(),
                        });
                    let mut s =
                        SyncSession::new_v3(&self.cfg.address, timeout, self.req_id, sec).map_err(io)?;
                    let (t, tries) = (self.timeout(), self.cfg.retries + 1);
                    retry(tries, || s.init()).map_err(|e| classify(e, "engine discovery", t, tries))?;
                    s
                }
            };
            self.session = Some(s);
        }
        self.session
            .as_mut()
            .ok_or_else(|| PollError::Other("no session".into()))
    }

    fn timeout(&self) -> Duration {
        Duration::from_millis(self.cfg.timeout_ms)
    }

    /// Reads uptime and every interface; drops the session on failure (the next poll opens a
    /// new one, re-discovering a restarted SNMPv3 engine).
    fn poll(&mut self) -> Result<(u32, Vec<IfRead>), PollError> {
        let r = self.poll_inner();
        if r.is_err() {
            self.session = None;
        }
        r
    }

    fn poll_inner(&mut self) -> Result<(u32, Vec<IfRead>), PollError> {
        let (t, tries) = (self.timeout(), self.cfg.retries + 1);
        let filter = self.cfg.interfaces.clone();
        let s = self.open()?;
        let names = walk_if_names(s, tries).map_err(|e| classify(e, "ifName walk", t, tries))?;
        let mut uptime = None;
        let mut out = Vec::new();
        for (index, name) in names {
            if !filter.is_empty() && !filter.contains(&name) {
                continue;
            }
            let (up, read) =
                read_if(s, index, name, tries).map_err(|e| classify(e, "interface get", t, tries))?;
            uptime = Some(up);
            out.push(read);
        }
        let uptime = match uptime {
            Some(u) => u,
            None => {
                let oid = make_oid(oids::SYS_UPTIME)?;
                let v = retry(tries, || {
                    let pdu = s.get(&oid)?;
                    Ok(pdu.varbinds.into_iter().find_map(|(_, v)| match v {
                        Value::Timeticks(t) => Some(t),
                        _ => None,
                    }))
                })
                .map_err(|e| classify(e, "sysUpTime get", t, tries))?;
                v.ok_or_else(|| PollError::Other("no sysUpTime in the answer".into()))?
            }
        };
        Ok((uptime, out))
    }
}

fn make_oid(arcs: &[u64]) -> Result<Oid<'static>, PollError> {
    Oid::from(arcs).map_err(|e| PollError::Other(format!("bad OID {arcs:?}: {e:?}")))
}

/// Runs `f` up to `tries` times while it times out or a stale answer arrives (request id
/// mismatch); a resynchronised SNMPv3 engine clock gets up to two more immediate tries.
fn retry<T>(tries: u32, mut f: impl FnMut() -> Result<T, snmp2::Error>) -> Result<T, snmp2::Error> {
    let (mut n, mut resync) = (1, 0);
    loop {
        match f() {
            Err(snmp2::Error::AuthUpdated) if resync < 2 => resync += 1,
            Err(snmp2::Error::Receive | snmp2::Error::RequestIdMismatch) if n < tries.max(1) => n += 1,
            other => return other,
        }
    }
}

/// The `(ifIndex, ifName)` pairs of the ifXTable, at most [`MAX_INTERFACES`].
fn walk_if_names(s: &mut SyncSession, tries: u32) -> Result<Vec<(u64, String)>, snmp2::Error> {
    let mut out = Vec::new();
    let column = oids::IF_NAME;
    let mut cursor: Vec<u64> = column.to_vec();
    loop {
        let oid = Oid::from(&cursor).map_err(|_| snmp2::Error::ValueOutOfRange)?;
        let batch = retry(tries, || {
            let pdu = s.getbulk(&[&oid], 0, BULK)?;
            let mut rows = Vec::new();
            let mut done = false;
            for (name, value) in pdu.varbinds {
                let arcs: Vec<u64> = name.iter().map(|i| i.collect()).unwrap_or_default();
                let in_column = arcs.len() == column.len() + 1 && arcs.starts_with(column);
                match value {
                    Value::OctetString(b) if in_column => {
                        rows.push((arcs[column.len()], String::from_utf8_lossy(b).into_owned()));
                    }
                    _ => {
                        done = true;
                        break;
                    }
                }
            }
            Ok((rows, done))
        })?;
        let (rows, done) = batch;
        let got = rows.len();
        for (index, name) in rows {
            cursor = [column, &[index]].concat();
            out.push((index, name));
            if out.len() >= MAX_INTERFACES {
                return Ok(out);
            }
        }
        if done || got == 0 {
            return Ok(out);
        }
    }
}

/// `sysUpTime` and one interface's objects, in one GET.
fn read_if(s: &mut SyncSession, index: u64, name: String, tries: u32) -> Result<(u32, IfRead), snmp2::Error> {
    let col = |c: &[u64]| Oid::from(&[c, &[index]].concat()).map_err(|_| snmp2::Error::ValueOutOfRange);
    let oids = [
        Oid::from(oids::SYS_UPTIME).map_err(|_| snmp2::Error::ValueOutOfRange)?,
        col(oids::IF_HC_IN_OCTETS)?,
        col(oids::IF_HC_OUT_OCTETS)?,
        col(oids::IF_HC_IN_UCAST_PKTS)?,
        col(oids::IF_HC_OUT_UCAST_PKTS)?,
        col(oids::IF_HIGH_SPEED)?,
        col(oids::IF_OPER_STATUS)?,
        col(oids::IF_DESCR)?,
    ];
    let refs: Vec<&Oid> = oids.iter().collect();
    retry(tries, || {
        let pdu = s.get_many(&refs)?;
        let mut up = 0u32;
        let mut c = [0u64; 4];
        let (mut speed, mut oper, mut descr) = (0.0, 4, String::new());
        for (i, (_, v)) in pdu.varbinds.enumerate() {
            match (i, v) {
                (0, Value::Timeticks(t)) => up = t,
                (1..=4, Value::Counter64(x)) => c[i - 1] = x,
                (5, Value::Unsigned32(x) | Value::Counter32(x)) => speed = f64::from(x),
                (6, Value::Integer(x)) => oper = x,
                (7, Value::OctetString(b)) => descr = String::from_utf8_lossy(b).into_owned(),
                _ => {}
            }
        }
        Ok((
            up,
            IfRead {
                name: name.clone(),
                descr,
                counters: IfCounters {
                    in_octets: c[0],
                    out_octets: c[1],
                    in_pkts: c[2],
                    out_pkts: c[3],
                },
                speed_mbps: speed,
                oper,
            },
        ))
    })
}

/// The SNMP sensor: polls every configured device each period (off the async workers: see
/// [`Sensor::blocking`]).
pub struct SnmpSensor {
    period: Duration,
    devices: Vec<Device>,
}

impl SnmpSensor {
    /// Checks `devices` ([`validate_devices`]); nothing is sent until the first sample.
    pub fn new(period: Duration, devices: Vec<SnmpDevice>) -> Result<SnmpSensor, SensorError> {
        validate_devices(&devices)?;
        let devices = devices
            .into_iter()
            .enumerate()
            .map(|(i, cfg)| {
                let creds = cfg.credentials()?;
                Ok(Device {
                    cfg,
                    creds,
                    session: None,
                    req_id: (i as i32).wrapping_mul(7919),
                    uptime: None,
                    ifaces: BTreeMap::new(),
                })
            })
            .collect::<Result<_, SensorError>>()?;
        Ok(SnmpSensor { period, devices })
    }
}

fn change(
    now_ns: i64,
    source: String,
    device: &str,
    kind: &str,
    iface: &str,
    before: String,
    after: String,
) -> EventData {
    EventData {
        name: NET_SNMP_CHANGE.to_string(),
        source,
        timestamp_ns: now_ns,
        numbers: Vec::new(),
        strings: vec![
            device.to_string(),
            kind.to_string(),
            iface.to_string(),
            before,
            after,
        ],
    }
}

impl Device {
    /// One poll's events.
    fn sample(&mut self, now_ns: i64, out: &mut Vec<EventData>) {
        let started = Instant::now();
        let result = self.poll();
        let poll_ms = started.elapsed().as_secs_f64() * 1e3;
        let name = self.cfg.name.clone();
        let (up, uptime_s, n, state, detail) = match result {
            Err(e) => (0.0, 0.0, 0.0, e.state(), e.detail().to_string()),
            Ok((uptime, reads)) => {
                let n = reads.len() as f64;
                self.apply(now_ns, uptime, reads, out);
                (1.0, f64::from(uptime) / 100.0, n, "ok", String::new())
            }
        };
        out.push(EventData {
            name: NET_SNMP_DEVICE.to_string(),
            source: name.clone(),
            timestamp_ns: now_ns,
            numbers: vec![up, uptime_s, n, poll_ms],
            strings: vec![
                name,
                self.cfg.address.clone(),
                self.cfg.version_label().to_string(),
                state.to_string(),
                detail,
            ],
        });
    }

    fn apply(&mut self, now_ns: i64, uptime: u32, reads: Vec<IfRead>, out: &mut Vec<EventData>) {
        let dev = self.cfg.name.clone();
        if let Some(prev) = self.uptime.replace(uptime) {
            if restarted(prev, uptime) {
                out.push(change(
                    now_ns,
                    dev.clone(),
                    &dev,
                    "restarted",
                    "",
                    format!("{}", f64::from(prev) / 100.0),
                    format!("{}", f64::from(uptime) / 100.0),
                ));
                // Counters restarted with the agent: no rate across the restart.
                self.ifaces.clear();
            }
        }
        let mut seen = BTreeMap::new();
        for r in reads {
            let source = format!("{dev}/{}", r.name);
            let prev = self.ifaces.remove(&r.name);
            if let Some(p) = &prev {
                if p.oper != r.oper {
                    out.push(change(
                        now_ns,
                        source.clone(),
                        &dev,
                        "oper_status",
                        &r.name,
                        oper_name(p.oper).to_string(),
                        oper_name(r.oper).to_string(),
                    ));
                }
                let dt_s = (now_ns - p.at_ns) as f64 / 1e9;
                if dt_s > 0.0 {
                    match if_rates(&p.counters, &r.counters, dt_s) {
                        Some(rates) => out.push(EventData {
                            name: NET_SNMP_IF.to_string(),
                            source,
                            timestamp_ns: now_ns,
                            numbers: vec![
                                rates[0],
                                rates[1],
                                rates[2],
                                rates[3],
                                r.speed_mbps,
                                r.oper as f64,
                                r.counters.in_octets as f64,
                                r.counters.out_octets as f64,
                            ],
                            strings: vec![dev.clone(), r.name.clone(), r.descr.clone()],
                        }),
                        None => out.push(change(
                            now_ns,
                            source,
                            &dev,
                            "counter_reset",
                            &r.name,
                            format!("{}", p.counters.in_octets),
                            format!("{}", r.counters.in_octets),
                        )),
                    }
                }
            }
            let keep = match prev {
                // A call not later than the last keeps the old baseline's time.
                Some(p) if now_ns <= p.at_ns => p,
                _ => IfState {
                    counters: r.counters,
                    oper: r.oper,
                    at_ns: now_ns,
                },
            };
            seen.insert(r.name, keep);
        }
        // Interfaces gone from the device are forgotten.
        self.ifaces = seen;
    }
}

/// IF-MIB's name of an `ifOperStatus` value.
pub fn oper_name(v: i64) -> &'static str {
    match v {
        1 => "up",
        2 => "down",
        3 => "testing",
        4 => "unknown",
        5 => "dormant",
        6 => "notPresent",
        7 => "lowerLayerDown",
        _ => "invalid",
    }
}

impl Sensor for SnmpSensor {
    fn name(&self) -> &str {
        SENSOR_NAME
    }

    fn schemas(&self) -> Vec<EventSchema> {
        vec![net_snmp_if(), net_snmp_device(), net_snmp_change()]
    }

    fn period(&self) -> Duration {
        self.period
    }

    fn blocking(&self) -> bool {
        true
    }

    fn sample(&mut self, now_ns: i64, out: &mut Vec<EventData>) -> Result<(), SensorError> {
        for d in &mut self.devices {
            d.sample(now_ns, out);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deltas_wraps_and_resets() {
        assert_eq!(counter_delta(10, 25), Some(15));
        assert_eq!(counter_delta(u64::MAX - 4, 5), Some(10), "wrap past 2^64");
        assert_eq!(counter_delta(1_000_000, 10), None, "discontinuity, not a wrap");
        assert!(restarted(500_000, 100));
        assert!(!restarted(100, 500_000));
        assert!(!restarted(u32::MAX - 50, 40), "sysUpTime wrap");
        let a = IfCounters {
            in_octets: 1000,
            out_octets: 2000,
            in_pkts: 10,
            out_pkts: 20,
        };
        let b = IfCounters {
            in_octets: 3000,
            out_octets: 2500,
            in_pkts: 30,
            out_pkts: 21,
        };
        assert_eq!(if_rates(&a, &b, 2.0), Some([1000.0, 250.0, 10.0, 0.5]));
        assert_eq!(if_rates(&b, &a, 2.0), None);
    }

    fn read(name: &str, octets: u64, oper: i64) -> IfRead {
        IfRead {
            name: name.to_string(),
            descr: name.to_string(),
            counters: IfCounters {
                in_octets: octets,
                out_octets: octets,
                in_pkts: octets / 100,
                out_pkts: octets / 100,
            },
            speed_mbps: 10.0,
            oper,
        }
    }

    fn device() -> Device {
        let cfg = SnmpDevice::v2c("r1", "127.0.0.1:9", "public");
        let creds = cfg.credentials().unwrap();
        Device {
            cfg,
            creds,
            session: None,
            req_id: 0,
            uptime: None,
            ifaces: BTreeMap::new(),
        }
    }

    #[test]
    fn rates_restarts_and_status_changes() {
        let mut d = device();
        let mut out = Vec::new();
        d.apply(0, 1000, vec![read("eth0", 1000, 1)], &mut out);
        assert!(out.is_empty(), "baseline");
        d.apply(2_000_000_000, 1200, vec![read("eth0", 5000, 2)], &mut out);
        let names: Vec<&str> = out.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(names, [NET_SNMP_CHANGE, NET_SNMP_IF]);
        assert_eq!(out[0].strings, ["r1", "oper_status", "eth0", "up", "down"]);
        assert_eq!(out[1].source, "r1/eth0");
        assert_eq!(out[1].numbers[0], 2000.0);
        assert_eq!(out[1].numbers[5], 2.0);
        out.clear();
        // the agent restarted: its counters start again, and no rate crosses the restart
        d.apply(4_000_000_000, 50, vec![read("eth0", 100, 2)], &mut out);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].strings[1], "restarted");
        out.clear();
        d.apply(5_000_000_000, 150, vec![read("eth0", 1100, 2)], &mut out);
        assert_eq!(out[0].numbers[0], 1000.0);
        out.clear();
        // a counter going back without a restart: no rate, a counter_reset change
        d.apply(6_000_000_000, 250, vec![read("eth0", 10, 2)], &mut out);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].strings[1], "counter_reset");
    }

    #[test]
    fn config_is_checked_and_secrets_are_redacted() {
        let good = SnmpDevice::v3("sw1", "127.0.0.1:161", "u", "authpass1", "privpass1");
        good.validate().unwrap();
        let shown = format!("{good:?}");
        assert!(
            !shown.contains("authpass1") && !shown.contains("privpass1"),
            "{shown}"
        );
        assert!(shown.contains("<redacted>"));
        let v2 = SnmpDevice::v2c("r1", "127.0.0.1:161", "s3cretcomm");
        assert!(!format!("{v2:?}").contains("s3cretcomm"));
        let cases: Vec<(SnmpDevice, &str)> = vec![
            (
                SnmpDevice {
                    address: "nope".into(),
                    ..v2.clone()
                },
                "host:port",
            ),
            (
                SnmpDevice {
                    community: None,
                    ..v2.clone()
                },
                "needs a community",
            ),
            (
                SnmpDevice {
                    version: "1".into(),
                    ..v2.clone()
                },
                "must be \"2c\" or \"3\"",
            ),
            (
                SnmpDevice {
                    timeout_ms: 0,
                    ..v2.clone()
                },
                "timeout_ms",
            ),
            (
                SnmpDevice {
                    auth_password: Some(Secret::new("short")),
                    ..good.clone()
                },
                "at least 8",
            ),
            (
                SnmpDevice {
                    priv_protocol: Some("RC4".into()),
                    ..good.clone()
                },
                "priv_protocol",
            ),
            (
                SnmpDevice {
                    priv_protocol: Some("AES-256".into()),
                    ..good.clone()
                },
                "too short",
            ),
            (
                SnmpDevice {
                    name: "bad name".into(),
                    ..v2.clone()
                },
                "name",
            ),
        ];
        for (d, want) in cases {
            let e = d.validate().unwrap_err().to_string();
            assert!(e.contains(want), "{e} (wanted {want})");
            assert!(!e.contains("s3cretcomm") && !e.contains("authpass1"), "{e}");
        }
        let twice = validate_devices(&[v2.clone(), v2.clone()]).unwrap_err();
        assert!(twice.to_string().contains("twice"));
        let a = directory_attributes(&[v2, good]);
        assert_eq!(a["snmp.devices"], "r1,sw1");
        assert_eq!(a["snmp.device.sw1"], "127.0.0.1:161 v3");
        assert!(a["snmp.statistics"].contains("ifHCInOctets"));
    }

    #[test]
    fn schemas_are_valid_and_match_the_events() {
        let mut d = device();
        let mut out = Vec::new();
        d.apply(0, 1000, vec![read("eth0", 1000, 1)], &mut out);
        d.apply(1_000_000_000, 1100, vec![read("eth0", 2000, 2)], &mut out);
        d.apply(2_000_000_000, 10, vec![read("eth0", 10, 2)], &mut out);
        let s = SnmpSensor::new(Duration::from_secs(1), Vec::new()).unwrap();
        for schema in s.schemas() {
            gma_core::event::validate_schema(&schema).unwrap_or_else(|e| panic!("{}: {e}", schema.name));
        }
        let shapes: BTreeMap<String, (usize, usize)> = s
            .schemas()
            .iter()
            .map(|sc| {
                let n = sc
                    .fields
                    .iter()
                    .filter(|f| f.r#type == gma_proto::v1::FieldType::Double as i32)
                    .count();
                (sc.name.clone(), (n, sc.fields.len() - n))
            })
            .collect();
        assert_eq!(out.len(), 3);
        for e in &out {
            assert_eq!(shapes[&e.name], (e.numbers.len(), e.strings.len()), "{}", e.name);
        }
    }

    #[test]
    fn toml_config() {
        #[derive(Deserialize)]
        struct C {
            snmp: Vec<SnmpDevice>,
        }
        let c: C = toml::from_str(
            "[[snmp]]\nname = \"r1\"\naddress = \"127.0.0.1:161\"\ncommunity = \"public\"\n\
             [[snmp]]\nname = \"sw\"\naddress = \"127.0.0.1:161\"\nversion = \"3\"\nuser = \"u\"\n\
             auth_password = \"aaaaaaaa\"\npriv_password = \"bbbbbbbb\"\nauth_protocol = \"SHA-256\"\n\
             priv_protocol = \"AES-256\"\n",
        )
        .unwrap();
        validate_devices(&c.snmp).unwrap();
        assert!(toml::from_str::<C>("[[snmp]]\nname=\"a\"\naddress=\"b:1\"\ncomunity=\"x\"\n").is_err());
    }
}
