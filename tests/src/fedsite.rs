//! Federation sites as real processes, each its own group (a directory, a producer of simulated
//! hosts, a federation endpoint), linked parent/child with `gma federation add`: the hierarchy
//! of the grid tests and the dashboard's hierarchy panel.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use crate::*;

const T: Duration = Duration::from_secs(30);

pub struct Site {
    pub name: String,
    pub dir: Proc,
    pub sim: Proc,
    pub fed: Proc,
}

pub fn start_site(tmp: &Path, name: &str, hosts: &[(&str, &str, u32)]) -> Site {
    start_site_with(tmp, name, hosts, "")
}

/// [`start_site`] with `extra` appended to the endpoint's config (it keeps its state in
/// `<tmp>/<name>/fed-data`).
pub fn start_site_with(tmp: &Path, name: &str, hosts: &[(&str, &str, u32)], extra: &str) -> Site {
    let d = tmp.join(name);
    std::fs::create_dir_all(&d).unwrap();
    let dir = Proc::directory(&d.join("dir"), "127.0.0.1:0");
    let mut sim = String::from("period_ms = 100\n");
    for (host, arch, free) in hosts {
        sim.push_str(&format!(
            "[[host]]\nname = \"{host}\"\narch = \"{arch}\"\ncpus = 4\nmemory_mb = 8192\nfree_cpus = {free}\n"
        ));
    }
    let sim_file = d.join("sim.toml");
    std::fs::write(&sim_file, sim).unwrap();
    let sim = Proc::simulated(&dir.addr, &sim_file, &["--lease-ttl-ms", "2000"]);
    let cfg = d.join("fed.toml");
    std::fs::write(
        &cfg,
        format!(
            "site = \"{name}\"\ntime_scale = {}\nheartbeat_ms = 200\nsummary_interval_ms = 500\n\
             push_debounce_ms = 20\nvalid_for_ms = 3000\nstatus_interval_ms = 500\ntick_ms = 50\n\
             lease_ttl_ms = 2000\ndata = \"{}\"\n{extra}",
            1.0 / 600.0,
            d.join("fed-data").display()
        ),
    )
    .unwrap();
    let fed = Proc::role("federation", &dir.addr, &cfg);
    Site {
        name: name.into(),
        dir,
        sim,
        fed,
    }
}

pub fn add(at: &Site, other: &Site, role: &str) {
    federation_add(&at.dir.addr, &other.name, &other.fed.addr, Some(role));
}

/// `child` under `parent`, both ways.
pub fn link(parent: &Site, child: &Site) {
    add(parent, child, "child");
    add(child, parent, "parent");
}

/// Until `s` has a live session with each of `peers`.
pub fn wait_live(s: &Site, peers: &[&str]) {
    let live = || {
        let v = federation_status(&s.fed.addr).ok()?;
        let up: BTreeSet<String> = v["peers"]
            .as_array()?
            .iter()
            .filter(|p| p["live"] == true)
            .map(|p| p["site"].as_str().unwrap_or_default().to_string())
            .collect();
        Some(up)
    };
    assert!(
        wait_until(T, || live()
            .is_some_and(|up| peers.iter().all(|p| up.contains(*p)))),
        "{} never had live sessions with {peers:?}: {:?}",
        s.name,
        live()
    );
}
