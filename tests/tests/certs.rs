//! `gma certs`: a CA and certificates that parse back to what was asked (subject, SANs, EKU,
//! issuer, validity, key modes), no silent overwrites, one-line errors.

#![allow(clippy::unwrap_used)]

use gma_tests as common;

use std::net::IpAddr;
use std::path::Path;
use std::time::Duration;

use common::*;
use gma_core::authz::{identity_from_der, Identity};
use x509_parser::extensions::GeneralName;
use x509_parser::pem::Pem;
use x509_parser::time::ASN1Time;

const T: Duration = Duration::from_secs(60);

fn ok(args: &[&str]) -> String {
    let r = gma(args, T);
    assert_eq!(r.code, 0, "gma {args:?} failed: {}", r.stderr);
    r.stdout
}

fn one_error_line(args: &[&str]) -> String {
    let r = gma(args, T);
    assert_ne!(r.code, 0, "gma {args:?} should fail; stdout {}", r.stdout);
    let lines: Vec<&str> = r.stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "want one clear line, got: {}", r.stderr);
    assert!(lines[0].starts_with("error: "), "{}", lines[0]);
    assert!(!r.stderr.contains("panicked"));
    lines[0].to_string()
}

/// The DER certificates of a PEM file, in order.
fn ders(path: &Path) -> Vec<Vec<u8>> {
    let bytes = std::fs::read(path).unwrap();
    Pem::iter_from_buffer(&bytes)
        .map(|p| {
            let p = p.unwrap();
            assert_eq!(p.label, "CERTIFICATE");
            p.contents
        })
        .collect()
}

fn mode(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

fn sans(der: &[u8]) -> Vec<String> {
    let (_, c) = x509_parser::parse_x509_certificate(der).unwrap();
    let ext = c.subject_alternative_name().unwrap().expect("SAN extension");
    ext.value
        .general_names
        .iter()
        .map(|n| match n {
            GeneralName::DNSName(d) => format!("dns:{d}"),
            GeneralName::IPAddress(b) => {
                let ip: IpAddr = match b.len() {
                    4 => <[u8; 4]>::try_from(*b).unwrap().into(),
                    16 => <[u8; 16]>::try_from(*b).unwrap().into(),
                    _ => panic!("bad IP SAN {b:?}"),
                };
                format!("ip:{ip}")
            }
            other => panic!("unexpected SAN {other:?}"),
        })
        .collect()
}

/// Checks validity: started (backdated a little), ends about `days` from now.
fn check_validity(der: &[u8], days: i64) {
    let (_, c) = x509_parser::parse_x509_certificate(der).unwrap();
    let now = ASN1Time::now().timestamp();
    let v = c.validity();
    assert!(v.is_valid(), "{v:?}");
    assert!(v.not_before.timestamp() <= now - 60, "{v:?}");
    let want = now + days * 86_400;
    assert!(
        (v.not_after.timestamp() - want).abs() < 300,
        "{v:?}, want ~{days} days"
    );
}

#[test]
fn init_then_issue_node_and_user_certificates() {
    let tmp = tempdir();
    let ca_dir = tmp.path().join("ca");
    let ca = ca_dir.to_str().unwrap();
    let out = ok(&["certs", "init", "--out", ca]);
    assert!(out.contains("ca.pem") && out.contains("GMA dev CA"), "{out}");
    assert_eq!(mode(&ca_dir.join("ca.key")), 0o600);
    assert!(std::fs::read_to_string(ca_dir.join("ca.key"))
        .unwrap()
        .starts_with("-----BEGIN PRIVATE KEY-----"));

    // The CA: self-signed, a CA, CN as asked, 825 days by default.
    let ca_ders = ders(&ca_dir.join("ca.pem"));
    assert_eq!(ca_ders.len(), 1);
    let (_, ca_cert) = x509_parser::parse_x509_certificate(&ca_ders[0]).unwrap();
    assert!(ca_cert.is_ca());
    assert_eq!(ca_cert.subject().to_string(), "CN=GMA dev CA");
    assert_eq!(ca_cert.issuer(), ca_cert.subject());
    ca_cert.verify_signature(None).unwrap();
    check_validity(&ca_ders[0], 825);

    // A node certificate with the default SANs, and a user certificate with its own.
    let certs = tmp.path().join("certs");
    let certs_s = certs.to_str().unwrap();
    let out = ok(&[
        "certs", "issue", "--ca", ca, "--name", "node-1", "--org", "siteA", "--out", certs_s,
    ]);
    assert!(out.contains("CN=node-1, O=siteA"), "{out}");
    ok(&[
        "certs",
        "issue",
        "--ca",
        ca,
        "--name",
        "alice",
        "--org",
        "Grid Users",
        "--san",
        "alice.example.org",
        "--san",
        "::1,10.1.2.3",
        "--days",
        "30",
        "--out",
        certs_s,
    ]);

    for (name, org, want_sans, days) in [
        (
            "node-1",
            "siteA",
            vec!["dns:node-1", "dns:localhost", "ip:127.0.0.1"],
            825,
        ),
        (
            "alice",
            "Grid Users",
            vec!["dns:alice", "dns:alice.example.org", "ip:::1", "ip:10.1.2.3"],
            30,
        ),
    ] {
        assert_eq!(mode(&certs.join(format!("{name}.key"))), 0o600, "{name}");
        let chain = ders(&certs.join(format!("{name}.pem")));
        assert_eq!(chain.len(), 2, "{name}: leaf then CA");
        assert_eq!(chain[1], ca_ders[0], "{name}: the CA follows the leaf");
        let (_, leaf) = x509_parser::parse_x509_certificate(&chain[0]).unwrap();
        // Subject, as the authorization layer reads it.
        assert_eq!(identity_from_der(&chain[0]).unwrap(), Identity::new(name, org));
        assert_eq!(leaf.subject().to_string(), format!("CN={name}, O={org}"));
        // Issued by the CA, signed by its key.
        assert_eq!(leaf.issuer(), ca_cert.subject());
        leaf.verify_signature(Some(ca_cert.public_key())).unwrap();
        assert!(!leaf.is_ca());
        // One certificate serves both ways.
        let eku = leaf.extended_key_usage().unwrap().expect("EKU").value;
        assert!(eku.server_auth && eku.client_auth, "{name}: {eku:?}");
        assert_eq!(sans(&chain[0]), want_sans, "{name}");
        check_validity(&chain[0], days);
        assert_ne!(leaf.serial, ca_cert.serial);
    }
    // Two different keys.
    assert_ne!(
        std::fs::read(certs.join("node-1.key")).unwrap(),
        std::fs::read(certs.join("alice.key")).unwrap()
    );
    // Without --org the identity has an empty org.
    ok(&["certs", "issue", "--ca", ca, "--name", "bob", "--out", certs_s]);
    let chain = ders(&certs.join("bob.pem"));
    assert_eq!(identity_from_der(&chain[0]).unwrap(), Identity::new("bob", ""));
    // A CA name of one's own.
    let other = tmp.path().join("ca2");
    ok(&[
        "certs",
        "init",
        "--out",
        other.to_str().unwrap(),
        "--name",
        "Site B CA",
        "--days",
        "10",
    ]);
    let d = ders(&other.join("ca.pem"));
    assert_eq!(identity_from_der(&d[0]).unwrap(), Identity::new("Site B CA", ""));
    check_validity(&d[0], 10);
}

#[test]
fn existing_files_are_not_replaced_without_force() {
    let tmp = tempdir();
    let ca_dir = tmp.path().join("ca");
    let ca = ca_dir.to_str().unwrap();
    ok(&["certs", "init", "--out", ca]);
    let before = std::fs::read(ca_dir.join("ca.key")).unwrap();
    let l = one_error_line(&["certs", "init", "--out", ca]);
    assert!(l.contains("already exist") && l.contains("--force"), "{l}");
    assert!(l.contains("ca.pem") && l.contains("ca.key"), "{l}");
    assert_eq!(std::fs::read(ca_dir.join("ca.key")).unwrap(), before);

    // Only one of the two present is refused too, and nothing is written.
    std::fs::remove_file(ca_dir.join("ca.pem")).unwrap();
    let l = one_error_line(&["certs", "init", "--out", ca]);
    assert!(l.contains("ca.key already exists"), "{l}");
    assert!(!ca_dir.join("ca.pem").exists());

    // --force replaces both, and the key stays private.
    std::fs::set_permissions(
        ca_dir.join("ca.key"),
        std::os::unix::fs::PermissionsExt::from_mode(0o644),
    )
    .unwrap();
    ok(&["certs", "init", "--out", ca, "--force"]);
    assert_ne!(std::fs::read(ca_dir.join("ca.key")).unwrap(), before);
    assert_eq!(mode(&ca_dir.join("ca.key")), 0o600);

    let out = tmp.path().join("c");
    let out_s = out.to_str().unwrap();
    ok(&["certs", "issue", "--ca", ca, "--name", "n1", "--out", out_s]);
    let first = std::fs::read(out.join("n1.pem")).unwrap();
    let l = one_error_line(&["certs", "issue", "--ca", ca, "--name", "n1", "--out", out_s]);
    assert!(l.contains("n1.pem") && l.contains("refusing to overwrite"), "{l}");
    assert_eq!(std::fs::read(out.join("n1.pem")).unwrap(), first);
    ok(&[
        "certs", "issue", "--ca", ca, "--name", "n1", "--out", out_s, "--force",
    ]);
    assert_ne!(std::fs::read(out.join("n1.pem")).unwrap(), first);
    // A certificate named "ca" in the CA directory would replace the CA: refused even forced.
    let l = one_error_line(&[
        "certs", "issue", "--ca", ca, "--name", "ca", "--out", ca, "--force",
    ]);
    assert!(l.contains("replace the CA"), "{l}");
}

#[test]
fn bad_arguments_are_one_clear_line() {
    let tmp = tempdir();
    let ca_dir = tmp.path().join("ca");
    let ca = ca_dir.to_str().unwrap();
    let out = tmp.path().join("out");
    let out_s = out.to_str().unwrap();

    // No CA yet.
    let l = one_error_line(&["certs", "issue", "--ca", ca, "--name", "n", "--out", out_s]);
    assert!(l.contains("ca.pem") && l.contains("gma certs init"), "{l}");
    let l = one_error_line(&["certs", "init", "--out", ca, "--days", "0"]);
    assert!(l.contains("--days 0") && l.contains("1 to 36500"), "{l}");
    let l = one_error_line(&["certs", "init", "--out", ca, "--name", " "]);
    assert!(l.contains("--name must not be empty"), "{l}");
    assert!(!ca_dir.join("ca.pem").exists());

    ok(&["certs", "init", "--out", ca]);
    let issue = |extra: &[&str]| {
        let mut args = vec!["certs", "issue", "--ca", ca, "--out", out_s];
        args.extend_from_slice(extra);
        one_error_line(&args)
    };
    let l = issue(&["--name", "../evil"]);
    assert!(l.contains("--name \"../evil\" is not allowed"), "{l}");
    let l = issue(&["--name", "n", "--san", "bad name"]);
    assert!(l.contains("--san \"bad name\"") && l.contains("DNS name"), "{l}");
    let l = issue(&["--name", "n", "--org", ""]);
    assert!(l.contains("--org must not be empty"), "{l}");
    let l = issue(&["--name", "n", "--days", "99999"]);
    assert!(l.contains("out of range"), "{l}");
    let l = issue(&["--name", &"x".repeat(65)]);
    assert!(l.contains("longer than 64"), "{l}");
    assert!(!out.exists(), "nothing written on errors");

    // A key from another CA.
    let other = tmp.path().join("other");
    ok(&["certs", "init", "--out", other.to_str().unwrap()]);
    std::fs::copy(other.join("ca.key"), ca_dir.join("ca.key")).unwrap();
    let l = issue(&["--name", "n"]);
    assert!(l.contains("does not belong to the certificate"), "{l}");

    // A leaf is not a CA.
    ok(&[
        "certs",
        "issue",
        "--ca",
        other.to_str().unwrap(),
        "--name",
        "leaf",
        "--out",
        other.to_str().unwrap(),
    ]);
    let fake = tmp.path().join("fake");
    std::fs::create_dir(&fake).unwrap();
    std::fs::copy(other.join("leaf.pem"), fake.join("ca.pem")).unwrap();
    std::fs::copy(other.join("leaf.key"), fake.join("ca.key")).unwrap();
    let l = one_error_line(&[
        "certs",
        "issue",
        "--ca",
        fake.to_str().unwrap(),
        "--name",
        "n",
        "--out",
        out_s,
    ]);
    assert!(l.contains("is not a CA certificate"), "{l}");

    // Garbage instead of PEM.
    std::fs::write(fake.join("ca.key"), "not a key").unwrap();
    let l = one_error_line(&[
        "certs",
        "issue",
        "--ca",
        fake.to_str().unwrap(),
        "--name",
        "n",
        "--out",
        out_s,
    ]);
    assert!(l.contains("ca.key: not a PKCS#8 private key"), "{l}");
}
