//! The Slurm adapter publishes its free slots (`rm.slots`, issue 22, item 1) computed from
//! Slurm's nodes and reservations: against a real throw-away Slurm cluster, a reservation made
//! in Slurm directly (not through the adapter) disappears from the offer, the adapter's price
//! is on every slot, a deleted one comes back, and a broker following `rm.slots` plans a
//! workflow on the node's slots.
//!
//! Without Slurm (not installed, not root) the test prints a skip message; under `CI=true` it
//! fails with the reason.

#![allow(clippy::unwrap_used)]

use gma_tests as common;

use std::time::Duration;

use common::slurm::cluster_or_skip;
use common::*;

const T: Duration = Duration::from_secs(120);

/// One offered slot: (resource, processors, start, end, price).
type Offered = (String, u64, i64, i64, f64);

/// The newest complete `rm.slots` snapshot `producer` holds: (version, its slots); None when
/// there is none yet.
fn newest_snapshot(producer: &str) -> Option<(f64, Vec<Offered>)> {
    let r = gma(
        &[
            "query",
            "rm.slots",
            "--producer",
            producer,
            "--since",
            "10m",
            "--output",
            "json",
        ],
        Duration::from_secs(30),
    );
    if r.code != 0 {
        return None;
    }
    let events: Vec<serde_json::Value> = r
        .stdout
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let newest = events
        .iter()
        .filter_map(|e| e["values"]["version"].as_f64())
        .fold(0.0, f64::max);
    let snap: Vec<&serde_json::Value> = events
        .iter()
        .map(|e| &e["values"])
        .filter(|v| v["version"].as_f64() == Some(newest))
        .collect();
    let count = snap.first()?["count"].as_f64()?;
    if snap.len() as f64 != count {
        return None; // not all of it read yet
    }
    let slots = snap
        .iter()
        .filter(|v| v["count"].as_f64() != Some(0.0))
        .map(|v| {
            (
                v["resource"].as_str().unwrap_or_default().to_string(),
                v["processors"].as_f64().unwrap_or(0.0) as u64,
                v["start_s"].as_f64().unwrap_or(0.0) as i64,
                v["end_s"].as_f64().unwrap_or(0.0) as i64,
                v["price"].as_f64().unwrap_or(f64::NAN),
            )
        })
        .collect();
    Some((newest, slots))
}

#[test]
fn the_slurm_adapter_offers_its_free_slots_around_slurm_reservations() {
    let Some(cluster) = cluster_or_skip("the_slurm_adapter_offers_its_free_slots_around_slurm_reservations")
    else {
        return;
    };
    let node = cluster.nodes[0].clone();
    let cpus = u64::from(cluster.cpus);
    let tmp = tempdir();
    let dir = Proc::directory(&tmp.path().join("dir"), "127.0.0.1:0");
    let cfg = cluster
        .adapter_config("slots_poll_ms = 200\nslot_s = 900\nprice = 3.5\n")
        .expect("adapter config");
    let adapter = Proc::role("slurm", &dir.addr, &cfg);
    // The first snapshot: the node free over the whole day, in slots of at most 900 s, at the
    // adapter's price.
    let mut last = None;
    let ok = wait_until(T, || {
        last = newest_snapshot(&adapter.addr);
        last.as_ref().is_some_and(|(_, s)| !s.is_empty())
    });
    assert!(
        ok,
        "no rm.slots snapshot from the adapter: {last:?}; {}",
        adapter.stderr_text()
    );
    let (first_version, slots) = last.clone().unwrap();
    for (res, n, s, e, price) in &slots {
        assert_eq!(
            (res.as_str(), *n, *price),
            (node.as_str(), cpus, 3.5),
            "{slots:?}"
        );
        assert!(e - s <= 900 && e > s, "{slots:?}");
    }
    // A reservation made in Slurm directly, over the whole node from 20 to 50 minutes ahead.
    let user = cluster.cmd("id", &["-un"]).unwrap().trim().to_string();
    let out = cluster
        .cmd(
            "scontrol",
            &[
                "create",
                "reservation",
                "ReservationName=outside",
                "StartTime=now+1200",
                "Duration=30",
                &format!("Nodes={node}"),
                &format!("Users={user}"),
            ],
        )
        .unwrap();
    assert!(out.contains("Reservation created"), "{out}");
    let line = cluster
        .reservations()
        .unwrap()
        .into_iter()
        .find(|l| l.starts_with("ReservationName=outside"))
        .unwrap();
    // Its window, read back from Slurm (StartTime=2026-11-27T05:00:00 in UTC: the cluster's TZ).
    let field = |k: &str| {
        let v = line
            .split_whitespace()
            .find_map(|p| p.strip_prefix(&format!("{k}=")))
            .unwrap();
        gma_broker::slurm::command::parse_time(v).unwrap_or_else(|| panic!("cannot read {k} from {line}"))
    };
    let (rs, re) = (field("StartTime"), field("EndTime"));
    // The adapter reads it and publishes a newer snapshot that offers nothing in its window
    // and the node's CPUs right before and after it.
    let ok = wait_until(T, || {
        last = newest_snapshot(&adapter.addr);
        last.as_ref().is_some_and(|(v, s)| {
            *v > first_version
                && !s.iter().any(|x| x.2 < re && rs < x.3)
                && s.iter().any(|x| x.3 == rs && x.1 == cpus)
                && s.iter().any(|x| x.2 == re && x.1 == cpus)
        })
    });
    let cleanup = cluster.cmd("scontrol", &["delete", "ReservationName=outside"]);
    assert!(
        ok,
        "the offer does not leave out {rs}..{re}: {last:?}; {}",
        adapter.stderr_text()
    );
    cleanup.unwrap();
    // Deleted: a newer snapshot offers the window again.
    let (v2, _) = last.clone().unwrap();
    let ok = wait_until(T, || {
        last = newest_snapshot(&adapter.addr);
        last.as_ref()
            .is_some_and(|(v, s)| *v > v2 && s.iter().any(|x| x.2 <= rs && rs < x.3))
    });
    assert!(ok, "the window is not offered again: {last:?}");
    // A broker following rm.slots holds the node's slots: a workflow is planned on them.
    let broker = Proc::start(
        &["broker", "--listen", "127.0.0.1:0", "--directory", &dir.addr],
        "gma broker listening on",
    );
    let wf = tmp.path().join("wf.toml");
    std::fs::write(
        &wf,
        "[[task]]\nid = \"a\"\nruntime_s = 600\nprocessors = 1\n\
         [[task]]\nid = \"b\"\nruntime_s = 600\nprocessors = 2\n\
         [[edge]]\nfrom = \"a\"\nto = \"b\"\n",
    )
    .unwrap();
    let plan = |_: ()| {
        gma(
            &[
                "broker",
                "provision",
                "--workflow",
                wf.to_str().unwrap(),
                "--broker",
                &broker.addr,
                "--alpha",
                "0",
                "--output",
                "json",
            ],
            T,
        )
    };
    let mut r = plan(());
    let ok = wait_until(T, || {
        r = plan(());
        r.code == 0
    });
    assert!(ok, "no plan on the broker's slots: {}\n{}", r.stdout, r.stderr);
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(v["offer"], "broker");
    for o in v["offered"].as_array().unwrap() {
        assert_eq!(
            (o["resource"].as_str(), o["price"].as_f64()),
            (Some(node.as_str()), Some(3.5)),
            "{o}"
        );
    }
    // Both tasks scheduled on the node, b after a on both of its CPUs.
    assert!(v["chosen"]["makespan_s"].as_i64().unwrap() >= 1200, "{v}");
    let sched = v["chosen"]["schedule"].as_array().unwrap();
    let b = sched.iter().find(|t| t["task"] == "b").unwrap();
    let a = sched.iter().find(|t| t["task"] == "a").unwrap();
    assert!(b["start_s"].as_i64() >= a["end_s"].as_i64(), "{v}");
    let b_cpus: u64 = b["parts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["processors"].as_u64().unwrap())
        .sum();
    assert_eq!(b_cpus, 2, "{v}");
    drop(broker);
    drop(adapter);
    drop(dir);
}
