//! The two inputs of the planner, read from TOML: a workflow DAG and a set of slot offers.
//!
//! Workflow file (docs/provisioning.md):
//!
//! ```toml
//! name = "montage-4"                  # optional
//! [[task]]
//! id = "mProject_1"                   # 1..=128 characters, unique
//! runtime_s = 14                      # whole seconds on one processor set, 0..=10^9
//! processors = 1                      # >= 1, all needed at once (a parallel task)
//! [[edge]]
//! from = "mProject_1"                 # parent
//! to = "mDiffFit_1"                   # child: starts after the parent ends (+ transfer)
//! data_mb = 4.2                       # optional, >= 0: moved when parent and child run on
//!                                     # different resources
//! ```
//!
//! Slot file:
//!
//! ```toml
//! now_s = 0                           # optional: when the plan is made (default: the
//!                                     # earliest slot start); makespan is counted from here
//! bandwidth_mb_s = 100                # optional: between resources (default 100)
//! latency_s = 0                       # optional: per transfer between resources (default 0)
//! [[slot]]
//! id = "a-0"                          # optional (default "slot-N")
//! resource = "siteA"                  # the reservable resource (its resource manager's name
//!                                     # for it); transfers inside one resource are free
//! start_s = 0
//! end_s = 3600                        # or duration_s = 3600 (exactly one of the two)
//! processors = 16
//! price = 1.0                         # service units per processor-hour (the paper's c_i)
//! fee = 0.0                           # optional: fixed charge for taking the slot (f_i)
//! ```

use std::collections::HashMap;

use serde::Deserialize;

/// Most tasks in a workflow.
pub const MAX_TASKS: usize = 100_000;
/// Most edges in a workflow.
pub const MAX_EDGES: usize = 1_000_000;
/// Most slots in an offer.
pub const MAX_SLOTS: usize = 4096;
/// Longest task runtime and slot length (about 31 years), so that sums cannot overflow.
pub const MAX_SPAN_S: i64 = 1_000_000_000;
/// Slot starts lie within ± this (about 31,700 years of seconds), so schedule arithmetic cannot
/// overflow.
pub const MAX_TIME_S: i64 = 1_000_000_000_000;
const MAX_ID: usize = 128;

/// Why a workflow or slot file was refused. Each message names the item and what to fix.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum FormatError {
    #[error("{0}")]
    Syntax(String),
    #[error("the workflow has no tasks: add [[task]] tables")]
    NoTasks,
    #[error("too many {what}: {got} (at most {max})")]
    TooMany {
        what: &'static str,
        got: usize,
        max: usize,
    },
    #[error("task[{index}]: id must be 1..={MAX_ID} characters")]
    BadTaskId { index: usize },
    #[error("task {id:?} is defined twice (task[{first}] and task[{second}]): give each task a unique id")]
    DuplicateTask { id: String, first: usize, second: usize },
    #[error("task {id:?}: processors must be at least 1")]
    ZeroProcessors { id: String },
    #[error("task {id:?}: runtime_s must be within 0..={MAX_SPAN_S}")]
    BadRuntime { id: String },
    #[error("edge[{index}].{field}: unknown task {name:?} (define it in a [[task]] table)")]
    UnknownTask {
        index: usize,
        field: &'static str,
        name: String,
    },
    #[error("edge[{index}]: task {id:?} cannot depend on itself")]
    SelfEdge { index: usize, id: String },
    #[error("edge[{index}]: {from:?} -> {to:?} is given twice")]
    DuplicateEdge { index: usize, from: String, to: String },
    #[error("edge[{index}].data_mb: must be a finite number >= 0")]
    BadData { index: usize },
    #[error("the workflow has a cycle: {0} (a workflow must be acyclic)")]
    Cycle(String),
    #[error("the offer has no slots: add [[slot]] tables")]
    NoSlots,
    #[error("slot[{index}]: {message}")]
    BadSlot { index: usize, message: String },
    #[error("{field}: {message}")]
    BadOffer { field: &'static str, message: String },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WorkflowFile {
    #[serde(default)]
    name: String,
    #[serde(default)]
    task: Vec<TaskFile>,
    #[serde(default)]
    edge: Vec<EdgeFile>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TaskFile {
    id: String,
    runtime_s: i64,
    processors: u32,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EdgeFile {
    from: String,
    to: String,
    #[serde(default)]
    data_mb: f64,
}

/// One task: `processors` processors held together for `runtime_s`.
#[derive(Debug, Clone, PartialEq)]
pub struct Task {
    pub id: String,
    pub runtime_s: i64,
    pub processors: u32,
}

/// A dependency: `to` starts after `from` ends (plus the transfer of `data_mb` when they run
/// on different resources).
#[derive(Debug, Clone, PartialEq)]
pub struct Edge {
    pub from: usize,
    pub to: usize,
    pub data_mb: f64,
}

/// A validated workflow: acyclic, every edge between known tasks.
#[derive(Debug, Clone, PartialEq)]
pub struct Workflow {
    pub name: String,
    pub tasks: Vec<Task>,
    pub edges: Vec<Edge>,
    /// Per task: (parent, data_mb).
    pub parents: Vec<Vec<(usize, f64)>>,
    /// Per task: (child, data_mb).
    pub children: Vec<Vec<(usize, f64)>>,
    /// A topological order (among ready tasks, the lowest index first).
    pub topo: Vec<usize>,
}

impl Workflow {
    /// Parses and validates a workflow file's text.
    pub fn from_toml(text: &str) -> Result<Workflow, FormatError> {
        let f: WorkflowFile = toml::from_str(text).map_err(|e| FormatError::Syntax(e.to_string()))?;
        let tasks = f
            .task
            .into_iter()
            .map(|t| Task {
                id: t.id,
                runtime_s: t.runtime_s,
                processors: t.processors,
            })
            .collect();
        let edges = f.edge.into_iter().map(|e| (e.from, e.to, e.data_mb)).collect();
        Workflow::new(f.name, tasks, edges)
    }

    /// Validates tasks and named edges (from, to, data_mb) into a workflow.
    pub fn new(
        name: String,
        tasks: Vec<Task>,
        edges: Vec<(String, String, f64)>,
    ) -> Result<Workflow, FormatError> {
        if tasks.is_empty() {
            return Err(FormatError::NoTasks);
        }
        too_many("tasks", tasks.len(), MAX_TASKS)?;
        too_many("edges", edges.len(), MAX_EDGES)?;
        let mut index: HashMap<&str, usize> = HashMap::new();
        for (i, t) in tasks.iter().enumerate() {
            if t.id.is_empty() || t.id.len() > MAX_ID {
                return Err(FormatError::BadTaskId { index: i });
            }
            if let Some(&first) = index.get(t.id.as_str()) {
                return Err(FormatError::DuplicateTask {
                    id: t.id.clone(),
                    first,
                    second: i,
                });
            }
            if t.processors == 0 {
                return Err(FormatError::ZeroProcessors { id: t.id.clone() });
            }
            if !(0..=MAX_SPAN_S).contains(&t.runtime_s) {
                return Err(FormatError::BadRuntime { id: t.id.clone() });
            }
            index.insert(&t.id, i);
        }
        let n = tasks.len();
        let mut parents = vec![Vec::new(); n];
        let mut children: Vec<Vec<(usize, f64)>> = vec![Vec::new(); n];
        let mut seen = std::collections::HashSet::new();
        let mut out = Vec::with_capacity(edges.len());
        for (i, (from, to, data_mb)) in edges.into_iter().enumerate() {
            let lookup = |field: &'static str, name: &str| {
                index.get(name).copied().ok_or_else(|| FormatError::UnknownTask {
                    index: i,
                    field,
                    name: gma_core::clip(name, MAX_ID).to_string(),
                })
            };
            let a = lookup("from", &from)?;
            let b = lookup("to", &to)?;
            if a == b {
                return Err(FormatError::SelfEdge { index: i, id: from });
            }
            if !(data_mb.is_finite() && data_mb >= 0.0) {
                return Err(FormatError::BadData { index: i });
            }
            if !seen.insert((a, b)) {
                return Err(FormatError::DuplicateEdge { index: i, from, to });
            }
            parents[b].push((a, data_mb));
            children[a].push((b, data_mb));
            out.push(Edge {
                from: a,
                to: b,
                data_mb,
            });
        }
        let topo = topological(&tasks, &parents, &children)?;
        Ok(Workflow {
            name,
            tasks,
            edges: out,
            parents,
            children,
            topo,
        })
    }

    /// Σ runtime × processors in processor-seconds: the best-effort allocation cost (Eq 9).
    pub fn work_s(&self) -> i64 {
        self.tasks
            .iter()
            .map(|t| t.runtime_s * i64::from(t.processors))
            .sum()
    }
}

fn too_many(what: &'static str, got: usize, max: usize) -> Result<(), FormatError> {
    if got > max {
        return Err(FormatError::TooMany { what, got, max });
    }
    Ok(())
}

/// Kahn's algorithm, the lowest ready index first; a cycle is named by walking parents among
/// the tasks left over until one repeats.
fn topological(
    tasks: &[Task],
    parents: &[Vec<(usize, f64)>],
    children: &[Vec<(usize, f64)>],
) -> Result<Vec<usize>, FormatError> {
    let n = tasks.len();
    let mut indeg: Vec<usize> = parents.iter().map(Vec::len).collect();
    let mut ready: std::collections::BinaryHeap<std::cmp::Reverse<usize>> =
        (0..n).filter(|&i| indeg[i] == 0).map(std::cmp::Reverse).collect();
    let mut order = Vec::with_capacity(n);
    while let Some(std::cmp::Reverse(t)) = ready.pop() {
        order.push(t);
        for &(c, _) in &children[t] {
            indeg[c] -= 1;
            if indeg[c] == 0 {
                ready.push(std::cmp::Reverse(c));
            }
        }
    }
    if order.len() == n {
        return Ok(order);
    }
    // Every leftover task has a leftover parent: walk back until a task repeats.
    let mut at = (0..n).find(|&i| indeg[i] > 0).unwrap_or(0);
    let mut pos = vec![usize::MAX; n];
    let mut path = Vec::new();
    while pos[at] == usize::MAX {
        pos[at] = path.len();
        path.push(at);
        at = parents[at]
            .iter()
            .map(|&(p, _)| p)
            .find(|&p| indeg[p] > 0)
            .unwrap_or(at);
    }
    // The walk went against the edges: the cycle forward is its first task, the rest
    // reversed, and the first again.
    let mut cycle = vec![tasks[at].id.as_str()];
    cycle.extend(path[pos[at] + 1..].iter().rev().map(|&i| tasks[i].id.as_str()));
    cycle.push(tasks[at].id.as_str());
    Err(FormatError::Cycle(cycle.join(" -> ")))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct OfferFile {
    now_s: Option<i64>,
    bandwidth_mb_s: Option<f64>,
    latency_s: Option<i64>,
    #[serde(default)]
    slot: Vec<SlotFile>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SlotFile {
    id: Option<String>,
    resource: String,
    start_s: i64,
    end_s: Option<i64>,
    duration_s: Option<i64>,
    processors: u32,
    price: f64,
    #[serde(default)]
    fee: f64,
}

/// An offered slot: `processors` processors of `resource` over `[start_s, end_s)`.
/// Taking it costs `price × processors × (end − start) / 3600 + fee` service units (Eq 4;
/// slots are taken whole: the paper's indivisible, non-extensible slots).
#[derive(Debug, Clone, PartialEq)]
pub struct Slot {
    pub id: String,
    pub resource: String,
    pub start_s: i64,
    pub end_s: i64,
    pub processors: u32,
    pub price: f64,
    pub fee: f64,
}

impl Slot {
    /// What taking the slot costs, in service units (1 SU = one processor-hour at price 1).
    pub fn cost(&self) -> f64 {
        self.price * f64::from(self.processors) * (self.end_s - self.start_s) as f64 / 3600.0 + self.fee
    }

    /// Checks the slot at `index` of an offer.
    fn check(&self, index: usize) -> Result<(), FormatError> {
        let bad = |message: String| Err(FormatError::BadSlot { index, message });
        if self.id.is_empty() || self.id.len() > MAX_ID {
            return bad(format!("id must be 1..={MAX_ID} characters"));
        }
        if self.resource.is_empty() || self.resource.len() > 256 {
            return bad("resource must be 1..=256 characters".into());
        }
        if self.processors == 0 {
            return bad("processors must be at least 1".into());
        }
        if !(-MAX_TIME_S..=MAX_TIME_S).contains(&self.start_s) {
            return bad(format!("start_s must be within ±{MAX_TIME_S}"));
        }
        let len = self.end_s.checked_sub(self.start_s).unwrap_or(-1);
        if !(1..=MAX_SPAN_S).contains(&len) {
            return bad(format!("end must be after start, by at most {MAX_SPAN_S} s"));
        }
        if !(self.price.is_finite() && self.price >= 0.0) {
            return bad("price must be a finite number >= 0".into());
        }
        if !(self.fee.is_finite() && self.fee >= 0.0) {
            return bad("fee must be a finite number >= 0".into());
        }
        Ok(())
    }
}

/// The slots on offer, with when the plan is made and the network between resources.
#[derive(Debug, Clone, PartialEq)]
pub struct Offer {
    pub now_s: i64,
    pub bandwidth_mb_s: f64,
    pub latency_s: i64,
    pub slots: Vec<Slot>,
}

impl Offer {
    /// Parses and validates a slot file's text.
    pub fn from_toml(text: &str) -> Result<Offer, FormatError> {
        let f: OfferFile = toml::from_str(text).map_err(|e| FormatError::Syntax(e.to_string()))?;
        let mut slots = Vec::with_capacity(f.slot.len());
        for (i, s) in f.slot.into_iter().enumerate() {
            let end_s = match (s.end_s, s.duration_s) {
                (Some(e), None) => e,
                (None, Some(d)) => s.start_s.saturating_add(d),
                _ => {
                    return Err(FormatError::BadSlot {
                        index: i,
                        message: "give exactly one of end_s and duration_s".into(),
                    })
                }
            };
            slots.push(Slot {
                id: s.id.unwrap_or_else(|| format!("slot-{i}")),
                resource: s.resource,
                start_s: s.start_s,
                end_s,
                processors: s.processors,
                price: s.price,
                fee: s.fee,
            });
        }
        let now_s = f
            .now_s
            .unwrap_or_else(|| slots.iter().map(|s| s.start_s).min().unwrap_or(0));
        Offer::new(
            now_s,
            f.bandwidth_mb_s.unwrap_or(100.0),
            f.latency_s.unwrap_or(0),
            slots,
        )
    }

    /// Validates an offer built in code (from a resource manager's calendar, or a generator).
    pub fn new(
        now_s: i64,
        bandwidth_mb_s: f64,
        latency_s: i64,
        slots: Vec<Slot>,
    ) -> Result<Offer, FormatError> {
        if slots.is_empty() {
            return Err(FormatError::NoSlots);
        }
        too_many("slots", slots.len(), MAX_SLOTS)?;
        if !(bandwidth_mb_s.is_finite() && bandwidth_mb_s > 0.0) {
            return Err(FormatError::BadOffer {
                field: "bandwidth_mb_s",
                message: "must be a finite number > 0".into(),
            });
        }
        if !(0..=MAX_SPAN_S).contains(&latency_s) {
            return Err(FormatError::BadOffer {
                field: "latency_s",
                message: format!("must be within 0..={MAX_SPAN_S}"),
            });
        }
        let mut ids = HashMap::new();
        for (i, s) in slots.iter().enumerate() {
            s.check(i)?;
            if let Some(first) = ids.insert(s.id.as_str(), i) {
                return Err(FormatError::BadSlot {
                    index: i,
                    message: format!(
                        "id {:?} is also slot[{first}]'s: give each slot a unique id",
                        s.id
                    ),
                });
            }
        }
        let earliest = slots.iter().map(|s| s.start_s).min().unwrap_or(now_s);
        if now_s.abs_diff(earliest) > MAX_SPAN_S as u64 {
            return Err(FormatError::BadOffer {
                field: "now_s",
                message: format!("must be within {MAX_SPAN_S} s of the earliest slot"),
            });
        }
        Ok(Offer {
            now_s,
            bandwidth_mb_s,
            latency_s,
            slots,
        })
    }

    /// Seconds to move `data_mb` between two different resources (latency + size / bandwidth,
    /// rounded up; nothing to move costs nothing).
    pub fn transfer_s(&self, data_mb: f64) -> i64 {
        if data_mb <= 0.0 {
            return 0;
        }
        let t = (data_mb / self.bandwidth_mb_s).ceil();
        self.latency_s + t.min(MAX_SPAN_S as f64) as i64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wf(text: &str) -> Result<Workflow, FormatError> {
        Workflow::from_toml(text)
    }

    const TASKS: &str = "[[task]]\nid = \"a\"\nruntime_s = 10\nprocessors = 1\n\
        [[task]]\nid = \"b\"\nruntime_s = 20\nprocessors = 2\n\
        [[task]]\nid = \"c\"\nruntime_s = 5\nprocessors = 1\n";

    #[test]
    fn a_valid_workflow_parses_in_topological_order() {
        let w = wf(&format!(
            "name = \"w\"\n{TASKS}[[edge]]\nfrom = \"c\"\nto = \"a\"\ndata_mb = 3\n[[edge]]\nfrom = \"a\"\nto = \"b\"\n"
        ))
        .unwrap();
        assert_eq!(w.topo, [2, 0, 1]);
        assert_eq!(w.parents[0], [(2, 3.0)]);
        assert_eq!(w.work_s(), 10 + 40 + 5);
    }

    #[test]
    fn bad_workflows_get_errors_naming_the_fault() {
        let cyc = wf(&format!(
            "{TASKS}[[edge]]\nfrom = \"a\"\nto = \"b\"\n[[edge]]\nfrom = \"b\"\nto = \"c\"\n[[edge]]\nfrom = \"c\"\nto = \"a\"\n"
        ))
        .unwrap_err();
        assert_eq!(cyc, FormatError::Cycle("a -> b -> c -> a".into()), "{cyc}");
        let unknown = wf(&format!("{TASKS}[[edge]]\nfrom = \"a\"\nto = \"zz\"\n")).unwrap_err();
        assert_eq!(
            unknown.to_string(),
            "edge[0].to: unknown task \"zz\" (define it in a [[task]] table)"
        );
        let zero = wf("[[task]]\nid = \"x\"\nruntime_s = 1\nprocessors = 0\n").unwrap_err();
        assert_eq!(zero, FormatError::ZeroProcessors { id: "x".into() });
        assert_eq!(wf("").unwrap_err(), FormatError::NoTasks);
        let dup = wf(&format!(
            "{TASKS}[[task]]\nid = \"b\"\nruntime_s = 1\nprocessors = 1\n"
        ))
        .unwrap_err();
        assert!(
            matches!(
                dup,
                FormatError::DuplicateTask {
                    first: 1,
                    second: 3,
                    ..
                }
            ),
            "{dup}"
        );
        let selfe = wf(&format!("{TASKS}[[edge]]\nfrom = \"a\"\nto = \"a\"\n")).unwrap_err();
        assert!(matches!(selfe, FormatError::SelfEdge { index: 0, .. }));
        let neg = wf(&format!(
            "{TASKS}[[edge]]\nfrom = \"a\"\nto = \"b\"\ndata_mb = -1\n"
        ))
        .unwrap_err();
        assert_eq!(neg, FormatError::BadData { index: 0 });
        let twice = wf(&format!(
            "{TASKS}[[edge]]\nfrom = \"a\"\nto = \"b\"\n[[edge]]\nfrom = \"a\"\nto = \"b\"\n"
        ))
        .unwrap_err();
        assert!(matches!(twice, FormatError::DuplicateEdge { index: 1, .. }));
        let runtime = wf("[[task]]\nid = \"x\"\nruntime_s = -1\nprocessors = 1\n").unwrap_err();
        assert!(matches!(runtime, FormatError::BadRuntime { .. }));
        assert!(matches!(
            wf("[[task]]\nid = \"x\"\n"),
            Err(FormatError::Syntax(_))
        ));
        assert!(matches!(
            wf("[[task]]\nid = \"x\"\nruntime_s = 1\nprocessors = 1\ncpus = 2\n"),
            Err(FormatError::Syntax(_))
        ));
    }

    #[test]
    fn offers_parse_with_defaults_and_refuse_bad_slots() {
        let o = Offer::from_toml(
            "[[slot]]\nresource = \"a\"\nstart_s = 100\nduration_s = 3600\nprocessors = 4\nprice = 2\nfee = 0.5\n\
             [[slot]]\nid = \"x\"\nresource = \"b\"\nstart_s = 50\nend_s = 60\nprocessors = 1\nprice = 1\n",
        )
        .unwrap();
        assert_eq!(o.now_s, 50);
        assert_eq!(o.slots[0].id, "slot-0");
        assert_eq!(o.slots[0].end_s, 3700);
        // Eq 4: c × n × d + f, d in hours.
        assert_eq!(o.slots[0].cost(), 2.0 * 4.0 + 0.5);
        assert_eq!(o.transfer_s(250.0), 3);
        assert_eq!(o.transfer_s(0.0), 0);
        let bad = |s: &str| Offer::from_toml(s).unwrap_err().to_string();
        assert_eq!(bad(""), "the offer has no slots: add [[slot]] tables");
        assert_eq!(
            bad("[[slot]]\nresource = \"a\"\nstart_s = 1\nend_s = 1\nprocessors = 1\nprice = 1\n"),
            format!("slot[0]: end must be after start, by at most {MAX_SPAN_S} s")
        );
        assert_eq!(
            bad("[[slot]]\nresource = \"a\"\nstart_s = 1\nprocessors = 1\nprice = 1\n"),
            "slot[0]: give exactly one of end_s and duration_s"
        );
        assert_eq!(
            bad("[[slot]]\nresource = \"a\"\nstart_s = 1\nend_s = 9\nprocessors = 0\nprice = 1\n"),
            "slot[0]: processors must be at least 1"
        );
        assert_eq!(
            bad("[[slot]]\nresource = \"a\"\nstart_s = 1\nend_s = 9\nprocessors = 1\nprice = -1\n"),
            "slot[0]: price must be a finite number >= 0"
        );
        assert_eq!(
            bad("[[slot]]\nresource = \"a\"\nstart_s = 9223372036854775000\nduration_s = 10\nprocessors = 1\nprice = 1\n"),
            format!("slot[0]: start_s must be within ±{MAX_TIME_S}")
        );
        assert!(bad("bandwidth_mb_s = 0\n[[slot]]\nresource = \"a\"\nstart_s = 1\nend_s = 9\nprocessors = 1\nprice = 1\n")
            .starts_with("bandwidth_mb_s"));
    }
}
