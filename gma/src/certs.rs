//! `gma certs`: development certificates made with rcgen (ECDSA P-256, ring backend).
//!
//! - `gma certs init --out DIR` writes a self-signed CA: `DIR/ca.pem` and `DIR/ca.key` (0600).
//! - `gma certs issue --ca DIR --name NAME --out DIR` writes `NAME.pem` (the leaf, then the CA)
//!   and `NAME.key` (0600): subject `CN=NAME, O=ORG`, extended key usage serverAuth *and*
//!   clientAuth (one certificate serves a node as server and as client), SANs NAME plus
//!   `localhost` and `127.0.0.1` unless `--san` is given.
//!
//! Keys are PKCS#8 PEM ("PRIVATE KEY"), what rustls and tonic's `Identity::from_pem` read.
//! Existing files are never replaced without `--force`. These are for development and tests: a
//! production grid uses its own CA.

use std::fs::OpenOptions;
use std::io::Write;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer,
    KeyPair, KeyUsagePurpose, SanType,
};
use x509_parser::time::ASN1Time;

const MAX_DAYS: u32 = 36_500;
/// Backdating of `notBefore`, so a peer whose clock is a little behind accepts a fresh cert.
const BACKDATE_SECS: i64 = 3600;
/// X.520 upper bound for CN and O.
const MAX_NAME_CHARS: usize = 64;

#[derive(Args, Debug)]
pub struct CertsArgs {
    #[command(subcommand)]
    pub command: CertsCommand,
}

#[derive(Subcommand, Debug)]
pub enum CertsCommand {
    /// Create a self-signed CA: OUT/ca.pem and OUT/ca.key (mode 0600).
    Init {
        /// Directory to write into (created if missing).
        #[arg(long)]
        out: PathBuf,
        /// The CA's common name.
        #[arg(long, default_value = "GMA dev CA")]
        name: String,
        /// Validity in days.
        #[arg(long, default_value_t = 825)]
        days: u32,
        /// Replace existing files.
        #[arg(long)]
        force: bool,
    },
    /// Issue a certificate signed by the CA in --ca: OUT/NAME.pem (leaf then CA) and
    /// OUT/NAME.key (mode 0600), usable as server and as client (serverAuth + clientAuth).
    Issue {
        /// Directory holding ca.pem and ca.key (from `gma certs init`).
        #[arg(long)]
        ca: PathBuf,
        /// Subject common name, the identity policies match (`cn`); also the file name and a
        /// SAN. Letters, digits, '.', '-', '_'.
        #[arg(long)]
        name: String,
        /// Subject organization (policies' `org`).
        #[arg(long)]
        org: Option<String>,
        /// Subject alternative name, DNS name or IP address (repeatable or comma-separated);
        /// default: localhost and 127.0.0.1. NAME is always included when it is a valid DNS
        /// name or IP.
        #[arg(long = "san", value_name = "DNS_OR_IP", value_delimiter = ',')]
        san: Vec<String>,
        /// Validity in days (never past the CA's own expiry).
        #[arg(long, default_value_t = 825)]
        days: u32,
        /// Directory to write into (created if missing).
        #[arg(long)]
        out: PathBuf,
        /// Replace existing files.
        #[arg(long)]
        force: bool,
    },
}

pub async fn run(args: CertsArgs) -> anyhow::Result<()> {
    match args.command {
        CertsCommand::Init {
            out,
            name,
            days,
            force,
        } => init(&out, &name, days, force),
        CertsCommand::Issue {
            ca,
            name,
            org,
            san,
            days,
            out,
            force,
        } => issue(&ca, &name, org.as_deref(), &san, days, &out, force),
    }
}

fn init(out: &Path, name: &str, days: u32, force: bool) -> anyhow::Result<()> {
    check_days(days)?;
    check_text("--name", name)?;
    let (cert_path, key_path) = (out.join("ca.pem"), out.join("ca.key"));
    check_free(&[&cert_path, &key_path], force)?;

    let mut params = CertificateParams::default();
    params.distinguished_name = DistinguishedName::new();
    params.distinguished_name.push(DnType::CommonName, name);
    // Path length 0: this CA signs leaves only.
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let (not_before, not_after) = validity(days, None)?;
    params.not_before = not_before.to_datetime();
    params.not_after = not_after.to_datetime();
    let key = KeyPair::generate().context("cannot generate the CA key")?;
    let cert = params
        .self_signed(&key)
        .context("cannot sign the CA certificate")?;

    std::fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
    write_file(&key_path, &key.serialize_pem(), 0o600, force)?;
    write_file(&cert_path, &cert.pem(), 0o644, force)?;
    println!(
        "wrote {} and {} (CA {name:?}, valid until {not_after})",
        cert_path.display(),
        key_path.display()
    );
    Ok(())
}

fn issue(
    ca_dir: &Path,
    name: &str,
    org: Option<&str>,
    sans: &[String],
    days: u32,
    out: &Path,
    force: bool,
) -> anyhow::Result<()> {
    check_days(days)?;
    check_file_name(name)?;
    if let Some(org) = org {
        check_text("--org", org)?;
    }
    let mut names: Vec<String> = Vec::new();
    if name.parse::<IpAddr>().is_ok() || valid_dns(name) {
        names.push(name.to_string());
    }
    if sans.is_empty() {
        names.extend(["localhost".to_string(), "127.0.0.1".to_string()]);
    }
    for s in sans {
        let s = s.trim();
        if s.parse::<IpAddr>().is_err() && !valid_dns(s) {
            bail!(
                "--san {s:?} is neither an IP address nor a DNS name (letters, digits, '-', dot-separated \
                 labels, optionally starting with \"*.\")"
            );
        }
        names.push(s.to_string());
    }
    let mut seen = std::collections::HashSet::new();
    names.retain(|n| seen.insert(n.to_ascii_lowercase()));

    let (ca_cert_path, ca_key_path) = (ca_dir.join("ca.pem"), ca_dir.join("ca.key"));
    let (cert_path, key_path) = (out.join(format!("{name}.pem")), out.join(format!("{name}.key")));
    if same_file(&cert_path, &ca_cert_path) || same_file(&key_path, &ca_key_path) {
        bail!(
            "--name {name:?} in the CA directory would replace the CA itself: choose another name or --out"
        );
    }
    let ca_pem = read(&ca_cert_path)?;
    let ca_key_pem = read(&ca_key_path)?;
    let ca_key = KeyPair::from_pem(&ca_key_pem)
        .map_err(|e| anyhow::anyhow!("{}: not a PKCS#8 private key: {e}", ca_key_path.display()))?;
    let (_, ca_block) = x509_parser::pem::parse_x509_pem(ca_pem.as_bytes())
        .map_err(|e| anyhow::anyhow!("{}: not a PEM certificate: {e}", ca_cert_path.display()))?;
    let ca_x509 = ca_block
        .parse_x509()
        .map_err(|e| anyhow::anyhow!("{}: not an X.509 certificate: {e}", ca_cert_path.display()))?;
    if !ca_x509.is_ca() {
        bail!(
            "{} is not a CA certificate (no CA basic constraint)",
            ca_cert_path.display()
        );
    }
    if ca_x509.public_key().subject_public_key.data.as_ref() != ca_key.public_key_raw() {
        bail!(
            "{} does not belong to the certificate {}: they come from different `gma certs init` runs",
            ca_key_path.display(),
            ca_cert_path.display()
        );
    }
    let ca_until = ca_x509.validity().not_after;
    if ca_until.timestamp() <= ASN1Time::now().timestamp() {
        bail!("the CA {} expired on {ca_until}", ca_cert_path.display());
    }
    check_free(&[&cert_path, &key_path], force)?;
    let issuer = Issuer::from_ca_cert_pem(&ca_pem, ca_key)
        .map_err(|e| anyhow::anyhow!("{}: cannot use as issuer: {e}", ca_cert_path.display()))?;

    let mut params = CertificateParams::default();
    params.distinguished_name = DistinguishedName::new();
    params.distinguished_name.push(DnType::CommonName, name);
    if let Some(org) = org {
        params.distinguished_name.push(DnType::OrganizationName, org);
    }
    params.subject_alt_names = names
        .iter()
        .map(|n| match n.parse::<IpAddr>() {
            Ok(ip) => Ok(SanType::IpAddress(ip)),
            Err(_) => n
                .clone()
                .try_into()
                .map(SanType::DnsName)
                .map_err(|e| anyhow::anyhow!("--san {n:?}: {e}")),
        })
        .collect::<anyhow::Result<_>>()?;
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    params.use_authority_key_identifier_extension = true;
    let (not_before, not_after) = validity(days, Some(ca_until))?;
    params.not_before = not_before.to_datetime();
    params.not_after = not_after.to_datetime();
    let key = KeyPair::generate().context("cannot generate a key")?;
    let cert = params
        .signed_by(&key, &issuer)
        .context("cannot sign the certificate")?;

    std::fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
    let mut chain = cert.pem();
    if !chain.ends_with('\n') {
        chain.push('\n');
    }
    let ca_block_text = first_pem_block(&ca_pem).unwrap_or(&ca_pem);
    chain.push_str(ca_block_text.trim_end());
    chain.push('\n');
    write_file(&key_path, &key.serialize_pem(), 0o600, force)?;
    write_file(&cert_path, &chain, 0o644, force)?;
    let subject = match org {
        Some(o) => format!("CN={name}, O={o}"),
        None => format!("CN={name}"),
    };
    println!(
        "wrote {} and {} ({subject}; SANs {}; valid until {not_after})",
        cert_path.display(),
        key_path.display(),
        names.join(", ")
    );
    Ok(())
}

/// `notBefore` an hour ago, `notAfter` in `days` days (but not after `cap`).
fn validity(days: u32, cap: Option<ASN1Time>) -> anyhow::Result<(ASN1Time, ASN1Time)> {
    let now = ASN1Time::now().timestamp();
    let mut until = now + i64::from(days) * 86_400;
    if let Some(cap) = cap {
        until = until.min(cap.timestamp());
    }
    let from = ASN1Time::from_timestamp(now - BACKDATE_SECS).context("bad validity start")?;
    let until = ASN1Time::from_timestamp(until).context("bad validity end")?;
    Ok((from, until))
}

fn check_days(days: u32) -> anyhow::Result<()> {
    if days == 0 || days > MAX_DAYS {
        bail!("--days {days} is out of range: give 1 to {MAX_DAYS}");
    }
    Ok(())
}

fn check_text(flag: &str, text: &str) -> anyhow::Result<()> {
    if text.trim().is_empty() {
        bail!("{flag} must not be empty");
    }
    if text.chars().count() > MAX_NAME_CHARS {
        bail!("{flag} is longer than {MAX_NAME_CHARS} characters");
    }
    if text.chars().any(char::is_control) {
        bail!("{flag} {text:?} has a control character");
    }
    Ok(())
}

/// NAME becomes a file name: letters, digits, '.', '-', '_'; not starting with '.' or '-'.
fn check_file_name(name: &str) -> anyhow::Result<()> {
    check_text("--name", name)?;
    let ok = name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'))
        && !name.starts_with(['.', '-']);
    if !ok {
        bail!(
            "--name {name:?} is not allowed: use letters, digits, '.', '-' and '_', not starting with '.' \
             or '-' (it names the files)"
        );
    }
    Ok(())
}

/// A DNS name for a SAN: dot-separated labels of letters, digits and '-' (not at a label's
/// ends), at most 63 bytes each and 253 in all; `*.` may lead.
fn valid_dns(name: &str) -> bool {
    let rest = name.strip_prefix("*.").unwrap_or(name);
    !rest.is_empty()
        && name.len() <= 253
        && rest.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        })
}

fn check_free(paths: &[&Path], force: bool) -> anyhow::Result<()> {
    if force {
        return Ok(());
    }
    let taken: Vec<String> = paths
        .iter()
        .filter(|p| p.symlink_metadata().is_ok())
        .map(|p| p.display().to_string())
        .collect();
    if !taken.is_empty() {
        bail!(
            "{} already exist{}: refusing to overwrite (give --force to replace)",
            taken.join(" and "),
            if taken.len() == 1 { "s" } else { "" }
        );
    }
    Ok(())
}

/// Writes a new file with `mode` (on Unix); with `force` an existing one is removed first, so
/// the mode is always the one asked for.
fn write_file(path: &Path, contents: &str, mode: u32, force: bool) -> anyhow::Result<()> {
    if force {
        match std::fs::remove_file(path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).with_context(|| format!("cannot replace {}", path.display())),
        }
    }
    let mut options = OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(mode);
    }
    #[cfg(not(unix))]
    let _ = mode;
    let mut file = options.open(path).map_err(|e| {
        if e.kind() == std::io::ErrorKind::AlreadyExists {
            anyhow::anyhow!(
                "{} already exists: refusing to overwrite (give --force to replace)",
                path.display()
            )
        } else {
            anyhow::anyhow!("cannot create {}: {e}", path.display())
        }
    })?;
    file.write_all(contents.as_bytes())
        .and_then(|()| file.sync_all())
        .with_context(|| format!("cannot write {}", path.display()))
}

fn read(path: &Path) -> anyhow::Result<String> {
    std::fs::read_to_string(path).map_err(|e| {
        let hint = if e.kind() == std::io::ErrorKind::NotFound {
            " (create the CA with `gma certs init --out DIR`)"
        } else {
            ""
        };
        anyhow::anyhow!("cannot read {}: {e}{hint}", path.display())
    })
}

fn same_file(a: &Path, b: &Path) -> bool {
    match (
        a.parent().map(Path::canonicalize),
        b.parent().map(Path::canonicalize),
    ) {
        (Some(Ok(da)), Some(Ok(db))) => da == db && a.file_name() == b.file_name(),
        _ => false,
    }
}

/// The first `-----BEGIN CERTIFICATE-----` ... `-----END CERTIFICATE-----` block of `pem`.
fn first_pem_block(pem: &str) -> Option<&str> {
    const END: &str = "-----END CERTIFICATE-----";
    let start = pem.find("-----BEGIN CERTIFICATE-----")?;
    let end = pem[start..].find(END)? + start + END.len();
    pem.get(start..end)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dns_names() {
        for ok in ["localhost", "node-1.example.org", "*.example.org", "a"] {
            assert!(valid_dns(ok), "{ok}");
        }
        for bad in ["", "-a", "a-", "a..b", "a b", "*.", "a_b", "*", &"a".repeat(64)] {
            assert!(!valid_dns(bad), "{bad}");
        }
    }

    #[test]
    fn pem_blocks() {
        let two = "x\n-----BEGIN CERTIFICATE-----\nAA\n-----END CERTIFICATE-----\n-----BEGIN CERTIFICATE-----\nBB\n-----END CERTIFICATE-----\n";
        assert_eq!(
            first_pem_block(two),
            Some("-----BEGIN CERTIFICATE-----\nAA\n-----END CERTIFICATE-----")
        );
        assert_eq!(first_pem_block("nothing"), None);
    }
}
