//! Summary traffic and propagation in the simulated world: a flat peer mesh against a
//! hierarchy (a complete tree of parent/child links) of the same sites, the real site manager
//! and its split-horizon summaries (`gma bench grid`). Bytes are the encoded sizes of the
//! summary messages the world delivers; propagation is the simulated time from a change at one
//! site until every other site's view (its own summary plus what its linked sites advertise,
//! which together cover every site once in both topologies) shows the new total of free CPUs.

use gma_broker::Job;

use super::{SiteSpec, World, T0};
use crate::site::{Link, Params, Role};

/// What one topology costs and how fast a change spreads.
#[derive(Debug, Clone)]
pub struct Spread {
    pub sites: usize,
    pub links: usize,
    /// Encoded bytes of one full refresh: every site's summary to every linked site.
    pub refresh_bytes: usize,
    /// Summary messages and their encoded bytes from the change until every site saw it.
    pub change_messages: u64,
    pub change_bytes: usize,
    /// Simulated ms from the change until the last site saw it, to [`STEP_MS`] (`None`: not
    /// within 120 s).
    pub propagation_ms: Option<f64>,
}

const NS_PER_MS: i64 = 1_000_000;
/// How often (simulated ms) every site's view is checked: the propagation time's resolution.
pub const STEP_MS: i64 = 5;

/// `n` sites of 4 hosts × 4 CPUs, as a full mesh of peer links (`fanout = None`) or a complete
/// tree with `fanout` children per manager; the default manager settings (summary refresh
/// 5 s, push debounce 250 ms) and 1 ms one-way latency. After 30 s of warm-up, a 4-CPU job
/// starts at the last site.
pub fn spread(n: usize, fanout: Option<usize>) -> Spread {
    let names: Vec<String> = (0..n).map(|i| format!("s{i:03}")).collect();
    let specs = names
        .iter()
        .map(|s| {
            let mut params = Params::new(s);
            // The simulated hosts report only when a job changes them: keep the others fresh.
            params.rank.max_age_ms = 86_400_000;
            SiteSpec {
                params,
                hosts: 4,
                cpus_per_host: 4,
            }
        })
        .collect();
    let pairs: Vec<(usize, usize)> = match fanout {
        None => (0..n).flat_map(|a| (a + 1..n).map(move |b| (a, b))).collect(),
        Some(f) => (1..n).map(|c| ((c - 1) / f.max(1), c)).collect(),
    };
    let refs: Vec<(&str, &str)> = pairs
        .iter()
        .map(|(a, b)| (names[*a].as_str(), names[*b].as_str()))
        .collect();
    let mut w = World::new(specs, &refs);
    if fanout.is_some() {
        // (parent, child): the child is an inferior of the parent, the parent its superior.
        let mut per: Vec<Vec<Link>> = vec![Vec::new(); n];
        for (p, c) in &pairs {
            per[*p].push(link(&names[*c], Role::Child));
            per[*c].push(link(&names[*p], Role::Parent));
        }
        for (i, links) in per.into_iter().enumerate() {
            w.sites[i].state.set_links(links, T0);
        }
    }
    w.run_until(T0 + 30_000 * NS_PER_MS);
    let refresh_bytes = refresh_bytes(&w);
    let sent0 = w.summaries_sent;
    w.summary_bytes.clear();
    let x = n - 1;
    let t0 = w.now;
    w.submit_at(
        t0,
        &names[x],
        Job {
            name: "change".into(),
            cpus: 4,
            reference_time_s: 3_600.0,
            ..Job::default()
        },
    );
    // Every site starts idle with 16 free CPUs; the job takes 4 at site x.
    let want = 16 * n as u64 - 4;
    let mut propagation_ms = None;
    let mut t = t0;
    while t < t0 + 120_000 * NS_PER_MS {
        t += STEP_MS * NS_PER_MS;
        w.run_until(t);
        if own_total(&w) == want && (0..n).all(|i| view(&w, i) == want) {
            propagation_ms = Some((w.now - t0) as f64 / 1e6);
            break;
        }
    }
    Spread {
        sites: n,
        links: pairs.len(),
        refresh_bytes,
        change_messages: w.summaries_sent - sent0,
        change_bytes: w.summary_bytes.iter().sum(),
        propagation_ms,
    }
}

fn link(site: &str, role: Role) -> Link {
    Link {
        site: site.into(),
        endpoint: format!("sim://{site}"),
        role,
        hops: 0,
    }
}

fn own_free(w: &World, i: usize) -> u64 {
    w.sites[i]
        .state
        .own_summary()
        .map_or(0, |s| u64::from(s.cpus_free_sum()))
}

/// Free CPUs over every site, from their own summaries.
fn own_total(w: &World) -> u64 {
    (0..w.sites.len()).map(|i| own_free(w, i)).sum()
}

/// Free CPUs over the grid as site `i` sees them: its own plus what its linked sites advertise.
fn view(w: &World, i: usize) -> u64 {
    let s = &w.sites[i].state;
    own_free(w, i)
        + s.peer_statuses(w.now)
            .iter()
            .map(|p| u64::from(p.cpus_free_sum))
            .sum::<u64>()
}

/// One full refresh: each site's summary to each linked site, encoded.
fn refresh_bytes(w: &World) -> usize {
    let mut bytes = 0;
    for site in &w.sites {
        for p in &site.peers {
            let name = w.sites[*p].state.site();
            if let Some(s) = site.state.summary_for(name, w.now) {
                bytes += s.encoded_len();
            }
        }
    }
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_change_reaches_every_site_in_a_mesh_and_in_a_tree() {
        let mesh = spread(3, None);
        assert_eq!(mesh.links, 3);
        assert!(mesh.propagation_ms.is_some(), "{mesh:?}");
        // One message per linked site from the changed one, at least.
        assert!(mesh.change_messages >= 2, "{mesh:?}");
        let tree = spread(7, Some(2));
        assert_eq!(tree.links, 6);
        assert!(tree.propagation_ms.is_some(), "{tree:?}");
        assert!(tree.refresh_bytes > 0);
    }

    /// Regression: three levels below the root, every site sees a change (a merged summary
    /// used to age by a refresh period per relay and be dropped as stale two relays away).
    #[test]
    fn a_change_reaches_every_site_of_a_three_level_tree() {
        let tree = spread(30, Some(4));
        assert!(tree.propagation_ms.is_some(), "{tree:?}");
    }
}
