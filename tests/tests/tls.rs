//! mTLS with generated certificates and real processes: a producer requiring client
//! certificates serves a client holding one, and refuses clients without one, with one from
//! another CA, and in plaintext.

#![allow(clippy::unwrap_used)]

use gma_tests as common;

use std::path::Path;
use std::time::Duration;

use common::*;

fn certs(dir: &Path) {
    make_certs(
        dir,
        &["ca", "other-ca"],
        &[
            ("ca", "node1", "site1"),
            ("ca", "alice", "site1"),
            ("other-ca", "mallory", "site1"),
        ],
    );
}

#[test]
fn producer_with_mtls_serves_only_certified_clients_of_its_ca() {
    let tmp = tempdir();
    let d = tmp.path().to_str().unwrap().to_string();
    certs(tmp.path());
    let sim = tmp.path().join("sim.toml");
    std::fs::write(
        &sim,
        "[[host]]\nname = \"h1\"\ncpus = 4\nmemory_mb = 1024\nload = 1.5\n",
    )
    .unwrap();
    let prod = Proc::producer(&[
        "--no-host-sensors",
        "--simulate",
        sim.to_str().unwrap(),
        "--tls-cert",
        &format!("{d}/certs/node1.pem"),
        "--tls-key",
        &format!("{d}/certs/node1.key"),
        "--tls-client-ca",
        &format!("{d}/ca/ca.pem"),
    ]);
    let query = |extra: &[&str]| {
        let mut args = vec!["query", "host.load", "--producer", &prod.addr, "--output", "json"];
        args.extend_from_slice(extra);
        gma(&args, Duration::from_secs(20))
    };
    let ca = format!("{d}/ca/ca.pem");
    let alice = [format!("{d}/certs/alice.pem"), format!("{d}/certs/alice.key")];
    assert!(wait_until(Duration::from_secs(15), || {
        let r = query(&["--tls-ca", &ca, "--tls-cert", &alice[0], "--tls-key", &alice[1]]);
        r.code == 0 && json_lines(&r.stdout).iter().any(|v| v["values"]["load1"] == 1.5)
    }));
    // No client certificate: refused at the handshake.
    let r = query(&["--tls-ca", &ca]);
    assert_ne!(r.code, 0, "served a client without a certificate: {}", r.stdout);
    assert!(r.stdout.is_empty());
    // A certificate from another CA.
    let m = [format!("{d}/certs/mallory.pem"), format!("{d}/certs/mallory.key")];
    let r = query(&["--tls-ca", &ca, "--tls-cert", &m[0], "--tls-key", &m[1]]);
    assert_ne!(r.code, 0, "served a certificate of another CA");
    assert!(r.stdout.is_empty());
    // Plaintext.
    let r = query(&[]);
    assert_ne!(r.code, 0, "served plaintext");
    // A client that does not trust the server's CA refuses the server.
    let other = format!("{d}/other-ca/ca.pem");
    let r = query(&[
        "--tls-ca",
        &other,
        "--tls-cert",
        &alice[0],
        "--tls-key",
        &alice[1],
    ]);
    assert_ne!(r.code, 0, "trusted a server of another CA");
}

#[test]
fn plaintext_is_refused_on_a_non_loopback_address() {
    let r = gma(
        &["producer", "--listen", "0.0.0.0:0", "--no-host-sensors"],
        Duration::from_secs(20),
    );
    assert_ne!(r.code, 0);
    assert!(r.stderr.contains("refusing plaintext on 0.0.0.0"), "{}", r.stderr);
}
