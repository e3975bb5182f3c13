//! TLS on the roles other than the directory and the producer, with generated certificates and
//! real processes, every one of them started with `--tls-ca/--tls-cert/--tls-key/--tls-client-ca`:
//!
//! - a `gma sink` receives a producer's pushed stream over mTLS, and a `gma relay` follows that
//!   producer over mTLS and serves its summary to a certified client;
//! - the migration loop (producer, rescheduler, `gma app-sim`) runs over mTLS: the rescheduler
//!   stops and resumes the application through its TLS AppControl endpoint;
//! - each of these endpoints serves a client holding a certificate of the CA and refuses one
//!   without a certificate and a plaintext one.

#![allow(clippy::unwrap_used)]

use gma_tests as common;

use std::path::Path;
use std::time::Duration;

use common::*;
use gma_proto::v1 as pb;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

/// `DIR/ca` and certificates `node1` (the roles) and `alice` (a client) in `DIR/certs`.
fn certs(dir: &Path) {
    make_certs(
        dir,
        &["ca"],
        &[("ca", "node1", "site1"), ("ca", "alice", "site1")],
    );
}

/// The flags every role of these tests runs with: mTLS served, TLS for its own connections.
fn tls_flags(d: &str) -> Vec<String> {
    vec![
        "--tls-ca".into(),
        format!("{d}/ca/ca.pem"),
        "--tls-cert".into(),
        format!("{d}/certs/node1.pem"),
        "--tls-key".into(),
        format!("{d}/certs/node1.key"),
        "--tls-client-ca".into(),
        format!("{d}/ca/ca.pem"),
    ]
}

fn start(args: &[&str], tls: &[String], marker: &str) -> Proc {
    let mut all: Vec<&str> = args.to_vec();
    all.extend(tls.iter().map(String::as_str));
    Proc::start(&all, marker)
}

#[derive(Clone, Copy, Debug)]
enum Client {
    /// TLS, presenting alice's certificate.
    Certified,
    /// TLS without a client certificate.
    NoCertificate,
    Plaintext,
}

#[derive(Clone, Copy, Debug)]
enum Service {
    Producer,
    Consumer,
    AppControl,
}

/// One call to the service at `addr` as `client`: its role (or application id) or the error.
fn probe(d: &Path, addr: &str, service: Service, client: Client) -> Result<String, String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let ep = match client {
            Client::Plaintext => Endpoint::from_shared(format!("http://{addr}")).unwrap(),
            Client::Certified | Client::NoCertificate => {
                let pem = |p: &str| std::fs::read(d.join(p)).unwrap();
                let mut tls = ClientTlsConfig::new()
                    .ca_certificate(Certificate::from_pem(pem("ca/ca.pem")))
                    .domain_name("127.0.0.1");
                if let Client::Certified = client {
                    tls = tls.identity(Identity::from_pem(pem("certs/alice.pem"), pem("certs/alice.key")));
                }
                Endpoint::from_shared(format!("https://{addr}"))
                    .unwrap()
                    .tls_config(tls)
                    .unwrap()
            }
        };
        let ch: Channel = ep
            .connect_timeout(Duration::from_secs(3))
            .timeout(Duration::from_secs(5))
            .connect()
            .await
            .map_err(|e| format!("connect: {e:?}"))?;
        let r = match service {
            Service::Producer => pb::producer_client::ProducerClient::new(ch)
                .version(pb::VersionRequest::default())
                .await
                .map(|r| r.into_inner().role),
            Service::Consumer => pb::consumer_client::ConsumerClient::new(ch)
                .version(pb::VersionRequest::default())
                .await
                .map(|r| r.into_inner().role),
            Service::AppControl => pb::app_control_client::AppControlClient::new(ch)
                .status(pb::AppStatusRequest::default())
                .await
                .map(|r| r.into_inner().app_id),
        };
        r.map_err(|s| format!("{s:?}"))
    })
}

/// `addr` serves a certified client (answering `want`) and refuses the others.
fn serves_only_certified(d: &Path, what: &str, addr: &str, service: Service, want: &str) {
    let got = probe(d, addr, service, Client::Certified);
    assert_eq!(
        got.as_deref(),
        Ok(want),
        "{what} did not serve a certified client"
    );
    for client in [Client::NoCertificate, Client::Plaintext] {
        let r = probe(d, addr, service, client);
        assert!(r.is_err(), "{what} served a {client:?} client: {r:?}");
    }
}

#[test]
fn sink_and_relay_take_streams_over_mtls_and_refuse_other_clients() {
    let tmp = tempdir();
    let dpath = tmp.path();
    let d = dpath.to_str().unwrap().to_string();
    certs(dpath);
    let tls = tls_flags(&d);
    let data = format!("{d}/dir");
    let dir = start(
        &["directory", "--listen", "127.0.0.1:0", "--data", &data],
        &tls,
        "gma directory listening on",
    );
    let sink = start(
        &["sink", "--directory", &dir.addr, "--accept", "host.load"],
        &tls,
        "gma sink listening on",
    );
    let relay_cfg = dpath.join("relay.toml");
    std::fs::write(&relay_cfg, "site = \"s1\"\nperiod_ms = 100\n").unwrap();
    let relay = start(
        &[
            "relay",
            "--directory",
            &dir.addr,
            "--listen",
            "127.0.0.1:0",
            "--config",
            relay_cfg.to_str().unwrap(),
        ],
        &tls,
        "gma relay listening on",
    );
    let sim = dpath.join("sim.toml");
    std::fs::write(
        &sim,
        "period_ms = 100\n[[host]]\nname = \"h1\"\ncpus = 4\nmemory_mb = 1024\nload = 1.5\n",
    )
    .unwrap();
    let prod = start(
        &[
            "producer",
            "--listen",
            "127.0.0.1:0",
            "--directory",
            &dir.addr,
            "--no-host-sensors",
            "--simulate",
            sim.to_str().unwrap(),
        ],
        &tls,
        "gma producer listening on",
    );

    // The producer found the sink through the directory and pushes to it, all over mTLS.
    assert!(
        wait_until(Duration::from_secs(30), || sink
            .stdout_lines()
            .iter()
            .any(|l| l.contains("\"host.load\"") && l.contains("\"h1\""))),
        "no pushed events; sink stderr: {}\nproducer stderr: {}",
        sink.stderr_text(),
        prod.stderr_text()
    );
    serves_only_certified(dpath, "the sink", &sink.addr, Service::Consumer, "consumer");

    // The relay follows the producer (directory and stream over mTLS) and serves its summary
    // to a certified client.
    let ca = format!("{d}/ca/ca.pem");
    let alice = [format!("{d}/certs/alice.pem"), format!("{d}/certs/alice.key")];
    let query = |extra: &[&str]| {
        let mut args = vec![
            "query",
            "site.load",
            "--producer",
            &relay.addr,
            "--output",
            "json",
        ];
        args.extend_from_slice(extra);
        gma(&args, Duration::from_secs(20))
    };
    assert!(
        wait_until(Duration::from_secs(30), || {
            let r = query(&["--tls-ca", &ca, "--tls-cert", &alice[0], "--tls-key", &alice[1]]);
            r.code == 0
                && json_lines(&r.stdout)
                    .iter()
                    .any(|v| v["values"]["hosts_up"] == 1.0)
        }),
        "relay stderr: {}",
        relay.stderr_text()
    );
    let r = query(&["--tls-ca", &ca]);
    assert!(
        r.code != 0 && r.stdout.is_empty(),
        "served without a certificate: {}",
        r.stdout
    );
    let r = query(&[]);
    assert!(
        r.code != 0 && r.stdout.is_empty(),
        "served plaintext: {}",
        r.stdout
    );
    serves_only_certified(dpath, "the relay", &relay.addr, Service::Producer, "producer");
}

#[test]
fn the_migration_loop_runs_over_mtls() {
    let tmp = tempdir();
    let dpath = tmp.path();
    let d = dpath.to_str().unwrap().to_string();
    certs(dpath);
    let tls = tls_flags(&d);
    let data = format!("{d}/dir");
    let dir = start(
        &["directory", "--listen", "127.0.0.1:0", "--data", &data],
        &tls,
        "gma directory listening on",
    );
    let sim = dpath.join("sim.toml");
    std::fs::write(
        &sim,
        "period_ms = 100\n[[host]]\nname = \"hostA\"\ncpus = 8\nmemory_mb = 1024\nload = 0.5\n\
         [[host]]\nname = \"hostB\"\ncpus = 8\nmemory_mb = 1024\nload = 0.5\n",
    )
    .unwrap();
    let prod = start(
        &[
            "producer",
            "--listen",
            "127.0.0.1:0",
            "--directory",
            &dir.addr,
            "--no-host-sensors",
            "--simulate",
            sim.to_str().unwrap(),
        ],
        &tls,
        "gma producer listening on",
    );
    let cfg = dpath.join("r.toml");
    std::fs::write(&cfg, "cost_s = 0.5\nthreshold = 0.3\nmax_age_ms = 2000\n").unwrap();
    let resched = start(
        &[
            "rescheduler",
            "--listen",
            "127.0.0.1:0",
            "--directory",
            &dir.addr,
            "--config",
            cfg.to_str().unwrap(),
        ],
        &tls,
        "gma rescheduler listening on",
    );
    serves_only_certified(
        dpath,
        "the rescheduler",
        &resched.addr,
        Service::Producer,
        "producer",
    );

    let client = [
        "--tls-ca".to_string(),
        format!("{d}/ca/ca.pem"),
        "--tls-cert".into(),
        format!("{d}/certs/alice.pem"),
        "--tls-key".into(),
        format!("{d}/certs/alice.key"),
    ];
    let cli = |args: &[&str]| {
        let mut all: Vec<&str> = args.to_vec();
        all.extend(client.iter().map(String::as_str));
        gma(&all, Duration::from_secs(10))
    };
    // The rescheduler is registered (over mTLS) before the application starts.
    assert!(
        wait_until(Duration::from_secs(20), || cli(&[
            "search",
            "resched.decision",
            "--directory",
            &dir.addr
        ])
        .stdout
        .contains("rescheduler")),
        "rescheduler stderr: {}",
        resched.stderr_text()
    );
    let app = start(
        &[
            "app-sim",
            "--app-id",
            "app1",
            "--phases",
            "30",
            "--predicted-s",
            "0.1",
            "--host",
            "hostA",
            "--producer",
            &prod.addr,
        ],
        &tls,
        "gma app-sim listening on",
    );
    serves_only_certified(dpath, "app-sim", &app.addr, Service::AppControl, "app1");
    let phases = || {
        let r = cli(&["query", "app.state", "--producer", &prod.addr, "--output", "json"]);
        json_lines(&r.stdout)
            .first()
            .and_then(|e| e["values"]["phase"].as_f64())
            .unwrap_or(0.0)
    };
    assert!(wait_until(Duration::from_secs(20), || phases() >= 3.0));
    let r = cli(&["sim", "set", "hostA", "load=40", "--producer", &prod.addr]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    // Stop and resume go from the rescheduler to the application's TLS AppControl endpoint.
    let finished_on = || {
        app.stdout_lines()
            .iter()
            .find_map(|l| l.split(" phases on ").nth(1).map(str::to_string))
    };
    assert!(
        wait_until(Duration::from_secs(60), || finished_on().is_some()),
        "app-sim stderr: {}\nrescheduler stderr: {}",
        app.stderr_text(),
        resched.stderr_text()
    );
    assert_eq!(finished_on().as_deref(), Some("hostB"));
    let err = app.stderr_text();
    assert!(
        err.contains("stopped after phase") && err.contains("resumed on hostB"),
        "{err}"
    );
}
