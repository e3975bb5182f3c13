//! Remote write from the archiver into a real Prometheus (docs/remote-write.md): a simulated
//! host's `host.load` goes producer → archiver → Prometheus' remote-write receiver, and
//! Prometheus' own query API returns exactly what `gma archive query` returns (values and
//! millisecond timestamps, every numeric field), across a kill -9 of the archiver mid-stream
//! (no gap, the resume point moves on) and across a Prometheus outage (samples wait in the
//! archive and are delivered once it is back).

#![allow(clippy::unwrap_used)]

use gma_tests as common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::prometheus::{prometheus_or_skip, Prometheus};
use common::*;

const HOST: &str = "h00";

/// A directory, a producer of `hosts` simulated hosts publishing `host.load` every 20 ms, and
/// the config of an archiver of `host.load` forwarding to `url` (more `[remote_write]` keys in
/// `rw`).
struct Fabric {
    dir: Proc,
    prod: Proc,
    data: PathBuf,
    cfg: PathBuf,
    /// Last: removed after the processes are gone.
    _tmp: tempfile::TempDir,
}

impl Fabric {
    fn new(url: &str, hosts: usize, rw: &str) -> Fabric {
        let tmp = tempdir();
        let dir = Proc::directory(&tmp.path().join("dir"), "127.0.0.1:0");
        let sim = sim_file(tmp.path(), "h", hosts, 20);
        let prod = Proc::simulated(&dir.addr, &sim, &[]);
        let cfg = tmp.path().join("archiver.toml");
        std::fs::write(
            &cfg,
            format!("patterns = [\"host.load\"]\n[remote_write]\nurl = \"{url}\"\n{rw}"),
        )
        .unwrap();
        Fabric {
            data: tmp.path().join("arch"),
            _tmp: tmp,
            dir,
            prod,
            cfg,
        }
    }

    /// Starts the archiver (again: same data), with its /metrics.
    fn archiver(&self) -> Proc {
        let cfg = self.cfg.to_str().unwrap();
        Proc::archiver(
            &self.dir.addr,
            &self.data,
            &["--config", cfg, "--metrics-listen", "127.0.0.1:0"],
        )
    }
}

/// Short batches and backoffs: many requests, quick retries.
const BRISK: &str =
    "batch_samples = 200\ninterval_ms = 50\nmin_backoff_ms = 50\nmax_backoff_ms = 400\ntimeout_ms = 2000\n";

/// The resume point per field of `host.load` from `HOST`: the last millisecond Prometheus
/// acknowledged (from the archiver's resume state, DATA/remote_write.json).
fn acked(data: &Path) -> BTreeMap<String, i64> {
    let Ok(text) = std::fs::read_to_string(data.join("remote_write.json")) else {
        return BTreeMap::new();
    };
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v["acked"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["event"] == "host.load" && a["source"] == HOST)
        .map(|a| {
            (
                a["field"].as_str().unwrap().to_string(),
                a["ms"].as_i64().unwrap(),
            )
        })
        .collect()
}

fn load1_acked(data: &Path) -> i64 {
    acked(data).get("load1").copied().unwrap_or(i64::MIN)
}

/// What `gma archive query` returns for `host.load` from `HOST`, per field: (timestamp ns,
/// value text); empty before the first sample. CSV output: its numbers are Rust's shortest round-trip form, parsed back
/// exactly (serde_json's default float parsing may be one ulp off); NaN prints empty.
fn archived(arch: &str) -> BTreeMap<String, Vec<(i64, String)>> {
    let run = gma(
        &[
            "archive",
            "query",
            "host.load",
            "--source",
            HOST,
            "--from",
            "-1h",
            "--output",
            "csv",
            "--archiver",
            arch,
        ],
        Duration::from_secs(30),
    );
    let mut out: BTreeMap<String, Vec<(i64, String)>> = BTreeMap::new();
    // Nothing archived yet.
    if run.code != 0 && run.stderr.contains("NotFound") {
        return out;
    }
    assert_eq!(run.code, 0, "{}", run.stderr);
    for l in run.stdout.lines().skip(1).filter(|l| !l.is_empty()) {
        let cols: Vec<&str> = l.splitn(5, ',').collect();
        assert_eq!(cols.len(), 5, "{l}");
        out.entry(cols[2].to_string())
            .or_default()
            .push((cols[3].parse().unwrap(), cols[4].to_string()));
    }
    out
}

/// A numeric value as text, NaN as "NaN" (the archive's CSV prints it empty).
fn text(v: &str) -> String {
    match v.parse::<f64>() {
        Ok(x) if !x.is_nan() => x.to_string(),
        Ok(_) => "NaN".into(),
        Err(_) if v.is_empty() => "NaN".into(),
        Err(e) => panic!("not a number: {v:?}: {e}"),
    }
}

/// For every numeric field with a resume point: Prometheus holds exactly the archived samples
/// up to it (in milliseconds; the first of each millisecond). Returns the samples compared.
fn same_in_prometheus(prom: &Prometheus, arch: &str, data: &Path) -> usize {
    // The resume point first: everything up to it was archived before it was sent.
    let resume = acked(data);
    assert!(!resume.is_empty(), "nothing acknowledged yet");
    let archive = archived(arch);
    let mut compared = 0;
    for (field, upto) in &resume {
        let mut want: Vec<(i64, String)> = Vec::new();
        for (ns, v) in archive
            .get(field)
            .unwrap_or_else(|| panic!("field {field} not archived"))
        {
            let ms = ns.div_euclid(1_000_000);
            if ms <= *upto && want.last().is_none_or(|l| l.0 < ms) {
                want.push((ms, text(v)));
            }
        }
        assert!(!want.is_empty(), "field {field}: nothing archived up to {upto}");
        let from = want[0].0;
        let selector =
            format!("host_load_{field}{{source=\"{HOST}\",event=\"host.load\",field=\"{field}\"}}");
        let got: Vec<(i64, String)> = prom
            .raw_samples(&selector, from, *upto)
            .unwrap()
            .into_iter()
            .map(|(t, v)| (t, text(&v.to_string())))
            .collect();
        if got != want {
            let first_diff = got.iter().zip(&want).position(|(a, b)| a != b);
            panic!(
                "field {field}: Prometheus holds {} samples, the archive {} (range {from}..={upto}); first difference at {first_diff:?}: got {:?} want {:?}",
                got.len(),
                want.len(),
                first_diff.map(|i| &got[i]),
                first_diff.map(|i| &want[i]),
            );
        }
        compared += want.len();
    }
    compared
}

/// The value of `name` (summed over its label sets) in the archiver's /metrics.
fn metric(addr: &str, name: &str) -> f64 {
    let (status, body) = http_get(addr, "/metrics").unwrap();
    assert_eq!(status, 200);
    body.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_once(' '))
        .filter(|(k, _)| *k == name || k.strip_prefix(name).is_some_and(|r| r.starts_with('{')))
        .map(|(_, v)| v.trim().parse::<f64>().unwrap())
        .sum()
}

#[test]
fn prometheus_returns_what_the_archive_holds_across_an_archiver_kill() {
    let Some(prom) = prometheus_or_skip("remote write: archiver kill") else {
        return;
    };
    let f = Fabric::new(&prom.write_url(), 1, BRISK);
    let data = f.data.clone();
    let mut arch = f.archiver();
    let delivered = |n: i64| {
        move |data: &Path| {
            let a = acked(data);
            a.len() >= 2 && a.values().all(|&ms| ms > n)
        }
    };
    let start = gma_core::time::now_ns() / 1_000_000;
    assert!(
        wait_until(Duration::from_secs(60), || delivered(start + 1000)(&data)),
        "nothing acknowledged by Prometheus; archiver: {}\nprometheus: {}",
        arch.stderr_text(),
        prom.log()
    );
    // kill -9 while the producer keeps publishing every 20 ms and the forwarder sends.
    arch.kill();
    let before = load1_acked(&data);
    let arch = f.archiver();
    assert!(
        wait_until(Duration::from_secs(60), || delivered(before + 2000)(&data)),
        "the resume point did not move on after the restart (was {before}); archiver: {}",
        arch.stderr_text()
    );
    let after = load1_acked(&data);
    assert!(after > before + 2000, "resume point {before} -> {after}");
    let n = same_in_prometheus(&prom, &arch.addr, &data);
    // Samples from both sides of the kill were compared (20 ms apart, > 2 s after it).
    assert!(n > 2 * 100, "only {n} samples compared");
    let metrics = printed_addr(&arch, "archiver", "metrics");
    assert!(metric(&metrics, "gma_archiver_remote_write_samples_sent_total") > 0.0);
    assert_eq!(
        metric(&metrics, "gma_archiver_remote_write_samples_failed_total"),
        0.0
    );
    assert!(
        metric(&metrics, "gma_archiver_remote_write_last_ack_timestamp_seconds") * 1000.0
            >= after as f64 - 1.0
    );
}

/// The crash window between the receiver's commit and the archiver's record of the
/// acknowledgement, made certain: Prometheus and the archiver are both killed (-9), so no request
/// can still be committed; Prometheus starts again, and the archiver's resume state is rewritten
/// so that the last second of each series Prometheus holds is "in flight" (the state a crash
/// right after Prometheus' commit leaves). The restarted archiver sends it again, Prometheus
/// refuses it (it holds those samples: out of order), the refusal is counted as a re-send, not a
/// failure, and forwarding goes on with nothing lost.
///
/// The second is taken from what Prometheus holds, not from the killed archiver's state: a
/// request that was in flight at the kill may or may not have been stored, and one re-sent
/// request spanning both stored and unstored samples is refused whole (Prometheus commits a
/// request all or nothing), which a real crash cannot produce.
#[test]
fn a_request_prometheus_already_stored_is_resent_after_a_crash_and_nothing_is_lost() {
    let Some(mut prom) = prometheus_or_skip("remote write: re-sent request") else {
        return;
    };
    let f = Fabric::new(&prom.write_url(), 1, BRISK);
    let data = f.data.clone();
    let start = gma_core::time::now_ns() / 1_000_000;
    let mut arch = f.archiver();
    // More than a second acknowledged per series: the re-sent second holds many samples.
    assert!(
        wait_until(Duration::from_secs(60), || {
            let a = acked(&data);
            a.len() >= 2 && a.values().all(|&ms| ms > start + 1500)
        }),
        "nothing acknowledged by Prometheus; archiver: {}",
        arch.stderr_text()
    );
    prom.stop();
    arch.kill();
    prom.start_again().unwrap();
    let path = data.join("remote_write.json");
    let mut state: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    // Per series: in flight = the last second Prometheus holds, acknowledged = just before.
    let now = gma_core::time::now_ns() / 1_000_000;
    let mut in_flight = Vec::new();
    for a in state["acked"].as_array_mut().unwrap() {
        let (event, source, field) = (
            a["event"].as_str().unwrap().to_string(),
            a["source"].as_str().unwrap().to_string(),
            a["field"].as_str().unwrap().to_string(),
        );
        let ms = a["ms"].as_i64().unwrap();
        // Only `host.load` is archived (the fabric's pattern); names as in same_in_prometheus.
        assert_eq!(event, "host.load");
        let selector =
            format!("host_load_{field}{{source=\"{source}\",event=\"{event}\",field=\"{field}\"}}");
        let held = prom
            .raw_samples(&selector, ms - 5000, now)
            .unwrap()
            .last()
            .map_or(i64::MIN, |s| s.0);
        assert!(
            held >= ms,
            "{selector}: Prometheus holds up to {held} after its restart, acknowledged {ms}: {}",
            prom.log()
        );
        a["ms"] = (held - 1001).into();
        in_flight.push(serde_json::json!({"event": event, "source": source, "field": field, "first_ms": held - 1000, "last_ms": held}));
    }
    let before = in_flight
        .iter()
        .filter_map(|v| v["last_ms"].as_i64())
        .max()
        .unwrap();
    state["in_flight"] = in_flight.into();
    std::fs::write(&path, serde_json::to_string(&state).unwrap()).unwrap();

    let arch = f.archiver();
    let metrics = printed_addr(&arch, "archiver", "metrics");
    assert!(
        wait_until(Duration::from_secs(60), || {
            let a = acked(&data);
            a.len() >= 2 && a.values().all(|&ms| ms > before + 1000)
        }),
        "the resume point did not move on after the restart; archiver: {}",
        arch.stderr_text()
    );
    assert!(
        metric(&metrics, "gma_archiver_remote_write_resend_refused_total") > 0.0,
        "the re-sent request was not refused: {}",
        arch.stderr_text()
    );
    assert_eq!(
        metric(&metrics, "gma_archiver_remote_write_samples_failed_total"),
        0.0
    );
    let n = same_in_prometheus(&prom, &arch.addr, &data);
    assert!(n > 100, "only {n} samples compared");
}

#[test]
fn samples_wait_while_prometheus_is_down_and_arrive_when_it_is_back() {
    let Some(mut prom) = prometheus_or_skip("remote write: outage") else {
        return;
    };
    let f = Fabric::new(&prom.write_url(), 1, BRISK);
    let data = f.data.clone();
    let arch = f.archiver();
    let metrics = printed_addr(&arch, "archiver", "metrics");
    assert!(
        wait_until(Duration::from_secs(60), || load1_acked(&data) > i64::MIN),
        "nothing acknowledged by Prometheus; archiver: {}",
        arch.stderr_text()
    );
    prom.stop();
    // Attempts fail and are retried; the resume point stays while samples pile up in the
    // archive.
    assert!(
        wait_until(Duration::from_secs(30), || metric(
            &metrics,
            "gma_archiver_remote_write_retries_total"
        ) >= 2.0),
        "no failed attempt counted; archiver: {}",
        arch.stderr_text()
    );
    let held = load1_acked(&data);
    let newest_archived = |arch: &str| {
        archived(arch)
            .get("load1")
            .and_then(|v| v.last())
            .map_or(i64::MIN, |s| s.0 / 1_000_000)
    };
    assert!(wait_until(Duration::from_secs(30), || newest_archived(
        &arch.addr
    ) > held + 2000));
    assert_eq!(
        load1_acked(&data),
        held,
        "the resume point moved while Prometheus was down"
    );
    assert!(metric(&metrics, "gma_archiver_remote_write_samples_pending") > 0.0);
    let waiting = newest_archived(&arch.addr);
    prom.start_again().unwrap();
    assert!(
        wait_until(Duration::from_secs(60), || load1_acked(&data) >= waiting),
        "the backlog was not delivered after Prometheus came back (resume {} < {waiting}); archiver: {}",
        load1_acked(&data),
        arch.stderr_text()
    );
    let n = same_in_prometheus(&prom, &arch.addr, &data);
    assert!(n > 100, "only {n} samples compared");
    assert_eq!(
        metric(&metrics, "gma_archiver_remote_write_samples_failed_total"),
        0.0
    );
}

/// The bound of the backlog with a real Prometheus: it is down from the start while samples are
/// archived; with `max_backlog = "2s"` the archiver, once it is back, sends the request that was
/// in flight and then skips what is older than 2 s (counted): Prometheus holds archived samples
/// only (exact values), one run of them missing, and everything after that run.
#[test]
fn a_backlog_older_than_max_backlog_is_skipped_and_counted() {
    let Some(mut prom) = prometheus_or_skip("remote write: backlog bound") else {
        return;
    };
    prom.stop();
    let f = Fabric::new(&prom.write_url(), 1, &format!("{BRISK}max_backlog = \"2s\"\n"));
    let data = f.data.clone();
    let arch = f.archiver();
    let metrics = printed_addr(&arch, "archiver", "metrics");
    let span = |arch: &str| {
        archived(arch)
            .get("load1")
            .filter(|v| !v.is_empty())
            .map_or(0, |v| (v[v.len() - 1].0 - v[0].0) / 1_000_000)
    };
    assert!(
        wait_until(Duration::from_secs(60), || span(&arch.addr) > 5000),
        "the archive did not fill; archiver: {}",
        arch.stderr_text()
    );
    assert!(metric(&metrics, "gma_archiver_remote_write_retries_total") >= 1.0);
    prom.start_again().unwrap();
    let back = gma_core::time::now_ns() / 1_000_000;
    assert!(
        wait_until(Duration::from_secs(60), || load1_acked(&data) > back),
        "nothing delivered after Prometheus came back; archiver: {}",
        arch.stderr_text()
    );
    assert!(metric(&metrics, "gma_archiver_remote_write_samples_skipped_total") > 0.0);
    let upto = load1_acked(&data);
    let mut archive: Vec<(i64, String)> = Vec::new();
    for (ns, v) in &archived(&arch.addr)["load1"] {
        let ms = ns.div_euclid(1_000_000);
        if ms <= upto && archive.last().is_none_or(|l| l.0 < ms) {
            archive.push((ms, text(v)));
        }
    }
    let selector = format!("host_load_load1{{source=\"{HOST}\"}}");
    let got: Vec<(i64, String)> = prom
        .raw_samples(&selector, archive[0].0, upto)
        .unwrap()
        .into_iter()
        .map(|(t, v)| (t, text(&v.to_string())))
        .collect();
    // Which archived samples Prometheus holds: (the request in flight, if it held load1), one
    // run of skipped samples, then every sample.
    let held: Vec<bool> = archive.iter().map(|s| got.contains(s)).collect();
    assert_eq!(
        held.iter().filter(|h| **h).count(),
        got.len(),
        "Prometheus holds samples the archive does not"
    );
    let skipped = held
        .iter()
        .position(|h| !h)
        .expect("no archived sample is missing from Prometheus");
    let resumed = held[skipped..]
        .iter()
        .position(|h| *h)
        .map(|i| i + skipped)
        .expect("nothing sent after the skipped run");
    assert!(
        held[resumed..].iter().all(|h| *h),
        "a second hole after the skipped run: {} of {} samples held after {resumed}",
        held[resumed..].iter().filter(|h| **h).count(),
        held.len() - resumed
    );
}

/// An https receiver: Prometheus serving TLS only (a certificate of a CA made with
/// `gma certs`). With another CA in `ca_file` the archiver refuses the server (attempts fail,
/// nothing is sent); with the right one everything arrives, exactly.
#[test]
fn https_receiver_with_its_ca_and_not_with_another() {
    let pki = tempdir();
    make_certs(pki.path(), &["ca", "other"], &[("ca", "prom", "gma")]);
    let (cert, key) = (
        pki.path().join("certs/prom.pem"),
        pki.path().join("certs/prom.key"),
    );
    let prom = match Prometheus::start_tls(&cert, &key, &pki.path().join("ca/ca.pem")) {
        Ok(p) => p,
        Err(e) => {
            common::netns::missing_capability("an https Prometheus", &e);
            return;
        }
    };
    assert!(prom.write_url().starts_with("https://"));
    let rw = |ca: &str| format!("{BRISK}ca_file = \"{}\"\n", pki.path().join(ca).display());
    let f = Fabric::new(&prom.write_url(), 1, &rw("other/ca.pem"));
    let data = f.data.clone();
    let mut arch = f.archiver();
    let metrics = printed_addr(&arch, "archiver", "metrics");
    assert!(
        wait_until(Duration::from_secs(30), || metric(
            &metrics,
            "gma_archiver_remote_write_retries_total"
        ) >= 2.0),
        "no failed attempt against a server of another CA; archiver: {}",
        arch.stderr_text()
    );
    assert_eq!(
        metric(&metrics, "gma_archiver_remote_write_samples_sent_total"),
        0.0
    );
    assert!(arch.stderr_text().contains("tls with"), "{}", arch.stderr_text());
    arch.kill();
    std::fs::write(
        &f.cfg,
        std::fs::read_to_string(&f.cfg)
            .unwrap()
            .replace("other/ca.pem", "ca/ca.pem"),
    )
    .unwrap();
    let start = gma_core::time::now_ns() / 1_000_000;
    let arch = f.archiver();
    assert!(
        wait_until(Duration::from_secs(60), || {
            let a = acked(&data);
            a.len() >= 2 && a.values().all(|&ms| ms > start + 1000)
        }),
        "nothing acknowledged over https; archiver: {}\nprometheus: {}",
        arch.stderr_text(),
        prom.log()
    );
    let n = same_in_prometheus(&prom, &arch.addr, &data);
    assert!(n > 50, "only {n} samples compared");
}

/// A figure, not a check: how fast a backlog drains into Prometheus. 20 simulated hosts
/// publish `host.load` every 20 ms into the archive while Prometheus is down; the producer
/// stops, Prometheus starts, and the time until the forwarder has nothing pending gives the
/// catch-up rate. `cargo nextest run -p gma-tests --test remote_write --run-ignored only
/// --no-capture` (docs/remote-write.md quotes it with its date and build).
#[test]
#[ignore]
fn catch_up_rate() {
    let Some(mut prom) = prometheus_or_skip("remote write: catch-up rate") else {
        return;
    };
    prom.stop();
    let mut f = Fabric::new(
        &prom.write_url(),
        20,
        "min_backoff_ms = 50\nmax_backoff_ms = 200\n",
    );
    let data = f.data.clone();
    let arch = f.archiver();
    let metrics = printed_addr(&arch, "archiver", "metrics");
    assert!(wait_until(Duration::from_secs(120), || metric(
        &metrics,
        "gma_archiver_samples_total"
    ) >= 300_000.0));
    f.prod.kill();
    let archived_total = metric(&metrics, "gma_archiver_samples_total");
    let t0 = std::time::Instant::now();
    prom.start_again().unwrap();
    assert!(
        wait_until(Duration::from_secs(600), || metric(
            &metrics,
            "gma_archiver_remote_write_samples_pending"
        ) == 0.0
            && metric(&metrics, "gma_archiver_remote_write_samples_sent_total") > 0.0),
        "not caught up; archiver: {}",
        arch.stderr_text()
    );
    let took = t0.elapsed();
    let sent = metric(&metrics, "gma_archiver_remote_write_samples_sent_total");
    println!(
        "remote write catch-up: {sent} samples (archive held {archived_total} incl. text fields) sent in {took:.2?} = {:.0} samples/s",
        sent / took.as_secs_f64()
    );
    let n = same_in_prometheus(&prom, &arch.addr, &data);
    println!("checked {n} samples of {HOST} against Prometheus");
}
