//! A batch job's lifecycle seen by the fabric's consumers (issue 21, must-show: "the job's
//! lifecycle events arrive in `gma subscribe job.*`; the archiver has them; the dashboard shows
//! running jobs"). Real processes throughout: a throw-away Slurm cluster (`common::slurm`, `common::slurm_fabric`), the
//! Slurm adapter, a directory and a broker; `gma subscribe 'job.*'`, an archiver of `job.*` and
//! the dashboard with headless Chromium on its page. A script submitted with
//! `gma job submit --broker` runs until the test lets it finish, so "running" is seen for sure.
//!
//! Without Slurm (not installed, not root) the test prints a skip message; under `CI=true` it
//! fails with the reason.

#![allow(clippy::unwrap_used)]

use gma_tests as common;

use std::time::Duration;

use common::cdp::Chrome;
use common::slurm::cluster_or_skip;
use common::slurm_fabric::{job_waiting_for, wait_exit, SlurmFabric};
use common::*;
use serde_json::Value;

/// Every `job.batch` event of `job_name` printed by `gma subscribe` (as printed).
fn subscribed(sub: &Proc, job_name: &str) -> Vec<Value> {
    sub.stdout_lines()
        .iter()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["name"] == "job.batch" && e["values"]["name"] == job_name)
        .collect()
}

fn states_of(events: &[Value]) -> Vec<&str> {
    events
        .iter()
        .map(|e| e["values"]["state"].as_str().unwrap_or(""))
        .collect()
}

/// The Jobs panel's rows: `data-id`, `data-state` and the cells' text.
const JOB_ROWS: &str = "JSON.stringify([...document.querySelectorAll('#jobs tbody tr')].map(r => \
     ({id: r.dataset.id, state: r.dataset.state, cells: [...r.cells].map(c => c.textContent)})))";

fn job_rows(c: &mut Chrome) -> Vec<Value> {
    c.eval(JOB_ROWS)
        .and_then(|v| v.as_str().map(str::to_string))
        .and_then(|s| serde_json::from_str(&s).ok())
        .unwrap_or_default()
}

/// The row of `row_id` ("ADAPTER JOBID") once it shows `state`.
fn wait_row(c: &mut Chrome, row_id: &str, state: &str, dash: &Proc) -> Value {
    let mut rows = Vec::new();
    let shown = wait_until(Duration::from_secs(60), || {
        rows = job_rows(c);
        rows.iter().any(|r| r["id"] == row_id && r["state"] == state)
    });
    assert!(
        shown,
        "the Jobs panel never showed {row_id:?} {state}; rows: {rows:#?}; dashboard: {}",
        dash.stderr_text()
    );
    rows.into_iter().find(|r| r["id"] == row_id).unwrap()
}

/// The archived `(timestamp_ns, value)` of one field of `job.batch` (empty while the archiver
/// holds nothing: NOT_FOUND).
fn archived(archiver: &str, field: &str) -> Vec<(i64, String)> {
    let r = gma(
        &[
            "archive",
            "query",
            "job.batch",
            "--field",
            field,
            "--from",
            "-1h",
            "--archiver",
            archiver,
            "--output",
            "json",
        ],
        Duration::from_secs(20),
    );
    if r.code != 0 {
        assert!(r.stderr.contains("NotFound"), "{}", r.stderr);
        return Vec::new();
    }
    json_lines(&r.stdout)
        .iter()
        .map(|v| {
            (
                v["timestamp_ns"].as_i64().unwrap(),
                match &v["value"] {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                },
            )
        })
        .collect()
}

/// The archived state changes of `job` (joined with the `job` field by timestamp).
fn archived_states(archiver: &str, job: &str) -> Vec<String> {
    let jobs = archived(archiver, "job");
    archived(archiver, "state")
        .into_iter()
        .filter(|(t, _)| jobs.iter().any(|(tj, j)| tj == t && j == job))
        .map(|(_, s)| s)
        .collect()
}

#[test]
fn a_slurm_jobs_lifecycle_reaches_subscribe_the_archiver_and_the_dashboard() {
    let test = "a_slurm_jobs_lifecycle_reaches_subscribe_the_archiver_and_the_dashboard";
    let Some(cluster) = cluster_or_skip(test) else {
        return;
    };
    let f = SlurmFabric::start(&cluster, "");
    let dir = f.dir.addr.clone();
    // `gma subscribe 'job.*'` from the adapter's oldest event on (a resume state file naming
    // the adapter), so it sees every state even if it connects after the job was submitted.
    let state = f.tmp.path().join("subscribe.state");
    std::fs::write(
        &state,
        format!(
            "{{\"producers\": {{\"{}\": {{\"epoch\": 0, \"next_seq\": 1}}}}}}",
            f.adapter_id
        ),
    )
    .unwrap();
    let sub = Proc::start(
        &[
            "subscribe",
            "job.*",
            "--directory",
            &dir,
            "--output",
            "json",
            "--state",
            state.to_str().unwrap(),
        ],
        "",
    );
    let arch = Proc::start(
        &[
            "archiver",
            "--listen",
            "127.0.0.1:0",
            "--directory",
            &dir,
            "--data",
            f.tmp.path().join("arch").to_str().unwrap(),
            "--pattern",
            "job.*",
        ],
        "gma archiver listening on",
    );
    let dash = Proc::start(
        &["dashboard", "--listen", "127.0.0.1:0", "--directory", &dir],
        "gma dashboard listening on",
    );
    let mut c = Chrome::launch();
    c.navigate(&format!("http://{}/", dash.addr));

    let jobs = cluster.job_dir();
    let go = jobs.join("go-watched");
    let mut run = f.submit(&job_waiting_for(&jobs, "watched", &go));

    // 1. `gma subscribe 'job.*'`: pending, then running.
    let mut seen = Vec::new();
    let running = wait_until(Duration::from_secs(60), || {
        seen = subscribed(&sub, "watched");
        states_of(&seen).contains(&"running")
    });
    assert!(
        running,
        "gma subscribe never printed the job running: {seen:#?}; subscribe: {}; adapter: {}",
        sub.stderr_text(),
        f.adapter.stderr_text()
    );
    assert_eq!(states_of(&seen), ["pending", "running"]);
    let running = &seen[1];
    let text = |f: &str| running["values"][f].as_str().unwrap_or("").to_string();
    let (job_id, reservation, source) = (
        text("job"),
        text("reservation"),
        running["source"].as_str().unwrap().to_string(),
    );
    assert!(!job_id.is_empty() && !reservation.is_empty(), "{running}");
    assert_eq!(text("resource"), cluster.node, "{running}");
    let q = cluster.cmd("squeue", &["-h", "-j", &job_id, "-o", "%T"]).unwrap();
    assert_eq!(q.trim(), "RUNNING", "Slurm runs job {job_id}");

    // 2. The dashboard's Jobs panel shows it running (no reload: the page is live).
    let row_id = format!("{source} {job_id}");
    let row = wait_row(&mut c, &row_id, "running", &dash);
    let cells: Vec<&str> = row["cells"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    // job, name, state, node, reservation, owner, started, runtime, exit code, adapter.
    assert_eq!(
        &cells[..4],
        [job_id.as_str(), "watched", "running", cluster.node.as_str()],
        "{row}"
    );
    assert_eq!(cells[4], reservation, "{row}");
    assert!(
        cells[6] != "–" && cells[7] != "–",
        "started and runtime shown: {row}"
    );
    assert_eq!((cells[8], cells[9]), ("", source.as_str()), "{row}");
    c.eval("window.__sameDocument = 42").unwrap();
    // A browser that connects now gets it in the snapshot.
    let (code, body) = http_get(&dash.addr, "/api/snapshot").unwrap();
    assert_eq!(code, 200, "{body}");
    let snap: Value = serde_json::from_str(&body).unwrap();
    let in_snapshot = snap["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|j| j["job"] == job_id.as_str() && j["source"] == source.as_str())
        .cloned();
    let in_snapshot = in_snapshot.unwrap_or_else(|| panic!("job {job_id} not in the snapshot: {snap}"));
    assert_eq!(
        (
            &in_snapshot["state"],
            &in_snapshot["reservation"],
            &in_snapshot["exit_code"]
        ),
        (
            &Value::from("running"),
            &Value::from(reservation.as_str()),
            &Value::Null
        ),
        "{in_snapshot}"
    );
    // A picture of the panel with the job running (target/test-artifacts/).
    let shot = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .unwrap()
        .join("test-artifacts")
        .join("dashboard-jobs.png");
    c.eval("document.querySelector('#jobs-section').scrollIntoView()");
    c.screenshot(&shot);
    eprintln!("screenshot: {}", shot.display());

    // 3. Released: completed with exit code 0 everywhere.
    std::fs::write(&go, "").unwrap();
    assert_eq!(wait_exit(&mut run), 0, "{}", run.stderr_text());
    let completed = wait_until(Duration::from_secs(60), || {
        seen = subscribed(&sub, "watched");
        seen.len() >= 3
    });
    assert!(completed, "gma subscribe: {seen:#?}");
    assert_eq!(states_of(&seen), ["pending", "running", "completed"]);
    assert_eq!(seen[2]["values"]["exit_code"], 0.0, "{}", seen[2]);
    let row = wait_row(&mut c, &row_id, "completed", &dash);
    assert_eq!(row["cells"][8], "0", "the exit code: {row}");
    assert_eq!(
        c.eval("window.__sameDocument").unwrap(),
        Value::from(42),
        "the page was reloaded"
    );

    // 4. The archiver has every state change (`gma archive query`, the real CLI).
    let mut kept = Vec::new();
    let all = wait_until(Duration::from_secs(60), || {
        kept = archived_states(&arch.addr, &job_id);
        kept.len() >= 3
    });
    assert!(
        all,
        "archived states of job {job_id}: {kept:?}; archiver: {}",
        arch.stderr_text()
    );
    assert_eq!(kept, ["pending", "running", "completed"]);
    let exits = archived(&arch.addr, "exit_code");
    assert_eq!(
        exits.last().and_then(|e| e.1.parse::<f64>().ok()),
        Some(0.0),
        "the archived exit code: {exits:?}"
    );

    // 5. A failing job: the panel shows it failed with its exit code, the completed one stays.
    let bad = jobs.join("failing.toml");
    std::fs::write(
        &bad,
        "name = \"failing\"\ncpus = 1\nwalltime_s = 60\ncommand = \"exit 3\"\n",
    )
    .unwrap();
    let mut run = f.submit(&bad);
    assert_eq!(wait_exit(&mut run), 1, "{}", run.stderr_text());
    let mut failed = Vec::new();
    let ended = wait_until(Duration::from_secs(60), || {
        failed = subscribed(&sub, "failing");
        states_of(&failed).contains(&"failed")
    });
    assert!(ended, "gma subscribe: {failed:#?}");
    let bad_id = failed[0]["values"]["job"].as_str().unwrap().to_string();
    let row = wait_row(&mut c, &format!("{source} {bad_id}"), "failed", &dash);
    assert_eq!(row["cells"][8], "3", "the exit code: {row}");
    let rows = job_rows(&mut c);
    assert!(
        rows.iter()
            .any(|r| r["id"] == row_id.as_str() && r["state"] == "completed"),
        "the finished job is kept: {rows:#?}"
    );
}
