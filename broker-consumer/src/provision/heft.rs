//! Slot-aware HEFT: the makespan of a workflow on a resource plan (a set of slots), the
//! paper's scheduling cost SC (Eq 5).
//!
//! Tasks are ranked by upward rank (runtime + the largest transfer-plus-rank of a child; a
//! transfer counts when the offer spans more than one resource) and placed in that order, each
//! at its earliest finish: on one resource, over processors of the plan's slots there that are
//! all active over the task's whole run (`slot.start ≤ start` and `start + runtime ≤ slot.end`)
//! and free then (insertion: gaps between earlier tasks are used). When no single slot has
//! enough processors the task takes them from several slots of that resource that overlap
//! its run (the paper's §5 modification). A task that fits nowhere makes the plan infeasible
//! (SC = ∞, `None`).

use super::format::{Offer, Workflow};

/// Where and when one task runs: `parts` are (slot index in the offer, processors from it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    pub start_s: i64,
    pub end_s: i64,
    pub parts: Vec<(usize, u32)>,
}

/// A complete schedule: placements per task (workflow order) and the makespan from `now_s`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schedule {
    pub makespan_s: i64,
    pub placements: Vec<Placement>,
}

impl Schedule {
    /// The slots some task runs in, ascending. HEFT on just these gives the same schedule
    /// (a slot no task chose never decided a placement), at no higher cost.
    pub fn used_slots(&self) -> Vec<usize> {
        let mut v: Vec<usize> = self
            .placements
            .iter()
            .flat_map(|p| p.parts.iter().map(|&(s, _)| s))
            .collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    /// The plan's cost when its slots are **divisible** (the paper's b_i, §2): each slot the
    /// schedule uses is charged only for the most processors used in it at once, over the
    /// span from its first task's start to its last task's end, plus its fee.
    pub fn divisible_cost(&self, p: &Problem) -> f64 {
        let mut total = 0.0;
        for slot in self.used_slots() {
            // (time, +n at a start / -n at an end) of the tasks in this slot.
            let mut ev: Vec<(i64, i64)> = Vec::new();
            for pl in &self.placements {
                for &(i, n) in &pl.parts {
                    if i == slot {
                        ev.push((pl.start_s, i64::from(n)));
                        ev.push((pl.end_s, -i64::from(n)));
                    }
                }
            }
            ev.sort_unstable();
            let (first, last) = (ev.first().map_or(0, |e| e.0), ev.last().map_or(0, |e| e.0));
            let (mut level, mut peak) = (0i64, 0i64);
            for (_, d) in ev {
                level += d;
                peak = peak.max(level);
            }
            let s = &p.offer.slots[slot];
            total += s.price * peak as f64 * (last - first) as f64 / 3600.0 + s.fee;
        }
        total
    }
}

/// A workflow and an offer with what HEFT computes once for every plan: the rank order, the
/// resource of each slot, and each slot's cost.
#[derive(Debug, Clone)]
pub struct Problem {
    pub workflow: Workflow,
    pub offer: Offer,
    /// Tasks by decreasing upward rank (ties in topological order).
    pub order: Vec<usize>,
    /// Resource index of each slot.
    pub slot_resource: Vec<usize>,
    /// Resource names, by index.
    pub resources: Vec<String>,
    pub slot_cost: Vec<f64>,
}

impl Problem {
    pub fn new(workflow: Workflow, offer: Offer) -> Problem {
        let mut resources: Vec<String> = Vec::new();
        let slot_resource = offer
            .slots
            .iter()
            .map(|s| match resources.iter().position(|r| *r == s.resource) {
                Some(i) => i,
                None => {
                    resources.push(s.resource.clone());
                    resources.len() - 1
                }
            })
            .collect();
        let cross = resources.len() > 1;
        let mut rank = vec![0i64; workflow.tasks.len()];
        for &t in workflow.topo.iter().rev() {
            let down = workflow.children[t]
                .iter()
                .map(|&(c, mb)| rank[c] + if cross { offer.transfer_s(mb) } else { 0 })
                .max()
                .unwrap_or(0);
            rank[t] = workflow.tasks[t].runtime_s + down;
        }
        let mut order = workflow.topo.clone();
        // Stable: a parent never ranks below its child, and equal ranks keep topological order.
        order.sort_by_key(|&t| std::cmp::Reverse(rank[t]));
        let slot_cost = offer.slots.iter().map(|s| s.cost()).collect();
        Problem {
            workflow,
            offer,
            order,
            slot_resource,
            resources,
            slot_cost,
        }
    }

    pub fn slots(&self) -> usize {
        self.offer.slots.len()
    }

    /// Allocation cost of a plan (Eq 4), summed in slot order.
    pub fn cost(&self, plan: &[usize]) -> f64 {
        plan.iter().map(|&s| self.slot_cost[s]).sum()
    }

    /// HEFT on the slots `plan` (indices into the offer, ascending). `None` when infeasible.
    pub fn schedule(&self, plan: &[usize]) -> Option<Schedule> {
        let wf = &self.workflow;
        let mut state: Vec<SlotState> = plan
            .iter()
            .map(|&s| SlotState {
                slot: s,
                untouched: self.offer.slots[s].processors,
                used: Vec::new(),
            })
            .collect();
        let mut groups: Vec<Vec<usize>> = vec![Vec::new(); self.resources.len()];
        for (i, &s) in plan.iter().enumerate() {
            groups[self.slot_resource[s]].push(i);
        }
        let mut placed: Vec<Option<(Placement, usize)>> = vec![None; wf.tasks.len()];
        for &t in &self.order {
            let task = &wf.tasks[t];
            let mut best: Option<(i64, usize)> = None;
            for (r, group) in groups.iter().enumerate() {
                if group.is_empty() {
                    continue;
                }
                let mut ready = self.offer.now_s;
                for &(p, mb) in &wf.parents[t] {
                    let (pl, pr) = placed[p].as_ref()?;
                    let moved = if *pr == r { 0 } else { self.offer.transfer_s(mb) };
                    ready = ready.max(pl.end_s + moved);
                }
                if let Some(st) =
                    earliest_start(&state, group, &self.offer, ready, task.runtime_s, task.processors)
                {
                    if best.is_none_or(|(b, _)| st < b) {
                        best = Some((st, r));
                    }
                }
            }
            let (st, r) = best?;
            let end = st + task.runtime_s;
            let parts = take(&mut state, &groups[r], &self.offer, st, end, task.processors);
            placed[t] = Some((
                Placement {
                    start_s: st,
                    end_s: end,
                    parts,
                },
                r,
            ));
        }
        let placements: Vec<Placement> = placed
            .into_iter()
            .map(|p| p.map(|(pl, _)| pl))
            .collect::<Option<_>>()?;
        let last = placements
            .iter()
            .map(|p| p.end_s)
            .max()
            .unwrap_or(self.offer.now_s);
        Some(Schedule {
            makespan_s: last - self.offer.now_s,
            placements,
        })
    }
}

/// Processors of one slot in the plan: never used ones are only counted; used ones keep
/// their busy intervals, sorted.
struct SlotState {
    slot: usize,
    untouched: u32,
    used: Vec<Vec<(i64, i64)>>,
}

fn free_over(busy: &[(i64, i64)], st: i64, end: i64) -> bool {
    !busy.iter().any(|&(a, b)| a < end && st < b)
}

impl SlotState {
    fn active(&self, offer: &Offer, st: i64, end: i64) -> bool {
        let s = &offer.slots[self.slot];
        s.start_s <= st && end <= s.end_s
    }

    fn free(&self, st: i64, end: i64) -> u32 {
        let used = self.used.iter().filter(|b| free_over(b, st, end)).count();
        self.untouched + u32::try_from(used).unwrap_or(u32::MAX)
    }
}

/// The earliest start ≥ `ready` at which `procs` processors of the group's slots are active
/// and free for `runtime`. Only event times can be earliest: `ready`, a slot start, the end
/// of a busy interval.
fn earliest_start(
    state: &[SlotState],
    group: &[usize],
    offer: &Offer,
    ready: i64,
    runtime: i64,
    procs: u32,
) -> Option<i64> {
    let capacity: u64 = group
        .iter()
        .map(|&i| u64::from(offer.slots[state[i].slot].processors))
        .sum();
    if capacity < u64::from(procs) {
        return None;
    }
    let mut times = vec![ready];
    for &i in group {
        let s = &state[i];
        let slot = &offer.slots[s.slot];
        if slot.end_s - slot.start_s < runtime || slot.end_s - runtime < ready {
            continue;
        }
        times.push(slot.start_s.max(ready));
        times.extend(s.used.iter().flatten().map(|&(_, b)| b).filter(|&b| b > ready));
    }
    times.sort_unstable();
    times.dedup();
    times.into_iter().find(|&st| {
        let end = st + runtime;
        let mut got = 0u32;
        for &i in group {
            if state[i].active(offer, st, end) {
                got = got.saturating_add(state[i].free(st, end));
                if got >= procs {
                    return true;
                }
            }
        }
        false
    })
}

/// Takes `procs` processors free over [st, end) from the group's active slots, the slots with
/// the most free processors first (fewest slots per task), busy ones before untouched ones.
fn take(
    state: &mut [SlotState],
    group: &[usize],
    offer: &Offer,
    st: i64,
    end: i64,
    procs: u32,
) -> Vec<(usize, u32)> {
    let mut cands: Vec<(u32, usize)> = group
        .iter()
        .filter(|&&i| state[i].active(offer, st, end))
        .map(|&i| (state[i].free(st, end), i))
        .filter(|&(f, _)| f > 0)
        .collect();
    cands.sort_by_key(|&(f, i)| (std::cmp::Reverse(f), state[i].slot));
    let mut need = procs;
    let mut parts = Vec::new();
    for (_, i) in cands {
        if need == 0 {
            break;
        }
        let s = &mut state[i];
        let mut took = 0;
        for busy in s.used.iter_mut() {
            if took == need {
                break;
            }
            if free_over(busy, st, end) {
                let at = busy.partition_point(|&(a, _)| a < st);
                busy.insert(at, (st, end));
                took += 1;
            }
        }
        while took < need && s.untouched > 0 {
            s.untouched -= 1;
            s.used.push(vec![(st, end)]);
            took += 1;
        }
        need -= took;
        parts.push((s.slot, took));
    }
    parts.sort_unstable();
    parts
}

/// Checks a schedule independently of how it was built: every task placed within the plan's
/// slots of one resource that are active over its run, processors per task as asked, no slot
/// over its processors at any moment, every edge respected with its transfer, and the makespan.
/// The tests' oracle (HEFT's and the GA's): the message says what is wrong.
#[cfg(test)]
pub(crate) fn check(p: &Problem, plan: &[usize], s: &Schedule) -> Result<(), String> {
    let wf = &p.workflow;
    if s.placements.len() != wf.tasks.len() {
        return Err("not every task is placed".into());
    }
    for (t, pl) in s.placements.iter().enumerate() {
        let task = &wf.tasks[t];
        if pl.end_s - pl.start_s != task.runtime_s || pl.start_s < p.offer.now_s {
            return Err(format!("task {t} runs {}..{}", pl.start_s, pl.end_s));
        }
        let got: u32 = pl.parts.iter().map(|&(_, n)| n).sum();
        if got != task.processors {
            return Err(format!("task {t} has {got} processors"));
        }
        let res = pl.parts.first().map(|&(sl, _)| p.slot_resource[sl]);
        for &(sl, _) in &pl.parts {
            let slot = &p.offer.slots[sl];
            if !plan.contains(&sl) || Some(p.slot_resource[sl]) != res {
                return Err(format!("task {t} uses slot {sl} outside its plan or resource"));
            }
            if slot.start_s > pl.start_s || pl.end_s > slot.end_s {
                return Err(format!("task {t} runs outside slot {sl}"));
            }
        }
        for &(parent, mb) in &wf.parents[t] {
            let pp = &s.placements[parent];
            let same = pp.parts.first().map(|&(sl, _)| p.slot_resource[sl]) == res;
            let moved = if same { 0 } else { p.offer.transfer_s(mb) };
            if pp.end_s + moved > pl.start_s {
                return Err(format!("task {t} starts before parent {parent} delivers"));
            }
        }
    }
    for &sl in plan {
        let mut points: Vec<i64> = s.placements.iter().map(|pl| pl.start_s).collect();
        points.sort_unstable();
        for at in points {
            let busy: u32 = s
                .placements
                .iter()
                .filter(|pl| pl.start_s <= at && at < pl.end_s)
                .flat_map(|pl| pl.parts.iter())
                .filter(|&&(x, _)| x == sl)
                .map(|&(_, n)| n)
                .sum();
            if busy > p.offer.slots[sl].processors {
                return Err(format!("slot {sl} holds {busy} processors at {at}"));
            }
        }
    }
    let last = s
        .placements
        .iter()
        .map(|pl| pl.end_s)
        .max()
        .unwrap_or(p.offer.now_s);
    if last - p.offer.now_s != s.makespan_s {
        return Err("wrong makespan".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::format::Slot;
    use super::*;

    pub(crate) fn slot(id: &str, resource: &str, start: i64, end: i64, procs: u32) -> Slot {
        Slot {
            id: id.into(),
            resource: resource.into(),
            start_s: start,
            end_s: end,
            processors: procs,
            price: 1.0,
            fee: 0.0,
        }
    }

    fn problem(wf: &str, slots: Vec<Slot>) -> Problem {
        let w = Workflow::from_toml(wf).unwrap();
        Problem::new(w, Offer::new(0, 10.0, 1, slots).unwrap())
    }

    const CHAIN: &str = "[[task]]\nid = \"a\"\nruntime_s = 10\nprocessors = 1\n\
        [[task]]\nid = \"b\"\nruntime_s = 20\nprocessors = 4\n\
        [[task]]\nid = \"c\"\nruntime_s = 10\nprocessors = 1\n\
        [[edge]]\nfrom = \"a\"\nto = \"b\"\ndata_mb = 100\n[[edge]]\nfrom = \"a\"\nto = \"c\"\ndata_mb = 100\n";

    #[test]
    fn a_wide_task_spans_slots_that_overlap_its_run() {
        // b needs 4 processors; x and y give 2 each over overlapping windows.
        let p = problem(
            CHAIN,
            vec![
                slot("x", "r", 0, 100, 2),
                slot("y", "r", 5, 60, 2),
                slot("z", "q", 0, 1000, 8),
            ],
        );
        let s = p.schedule(&[0, 1]).unwrap();
        check(&p, &[0, 1], &s).unwrap();
        assert_eq!(s.placements[1].start_s, 10);
        assert_eq!(s.placements[1].parts, [(0, 2), (1, 2)]);
        // c fits beside b on... no processor is free in [10, 20) (b holds all 4): c waits.
        assert_eq!((s.placements[2].start_s, s.makespan_s), (30, 40));
        // Either slot alone is too small for b: infeasible (SC = ∞).
        assert!(p.schedule(&[0]).is_none());
        assert!(p.schedule(&[1]).is_none());
        // Across resources the edge a -> b pays 1 s latency + 100 MB / 10 MB/s.
        let s = p.schedule(&[0, 2]).unwrap();
        check(&p, &[0, 2], &s).unwrap();
        assert_eq!(s.placements[0].parts, [(0, 1)]);
        assert_eq!(
            (s.placements[1].start_s, s.placements[1].parts.clone()),
            (21, vec![(2, 4)])
        );
        assert_eq!(s.placements[2].start_s, 10);
        assert_eq!(s.makespan_s, 41);
        assert!((p.cost(&[0, 2]) - (200.0 + 8000.0) / 3600.0).abs() < 1e-12);
    }

    #[test]
    fn a_task_fits_a_slot_only_inside_its_window() {
        let one = "[[task]]\nid = \"a\"\nruntime_s = 50\nprocessors = 1\n";
        // Too short a slot, then a later, long enough one.
        let p = problem(one, vec![slot("s", "r", 0, 40, 1), slot("t", "r", 100, 150, 1)]);
        assert!(p.schedule(&[0]).is_none());
        let s = p.schedule(&[0, 1]).unwrap();
        assert_eq!((s.placements[0].start_s, s.makespan_s), (100, 150));
        // Tasks queue on the one processor; c waits for its parent b.
        let two = "[[task]]\nid = \"a\"\nruntime_s = 50\nprocessors = 1\n\
                   [[task]]\nid = \"b\"\nruntime_s = 5\nprocessors = 1\n\
                   [[task]]\nid = \"c\"\nruntime_s = 10\nprocessors = 1\n[[edge]]\nfrom = \"b\"\nto = \"c\"\n";
        let p = problem(two, vec![slot("s", "r", 0, 1000, 1)]);
        let s = p.schedule(&[0]).unwrap();
        check(&p, &[0], &s).unwrap();
        assert_eq!(s.makespan_s, 65);
    }
}
