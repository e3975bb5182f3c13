//! A linearizability checker for histories of directory operations on producer records, and
//! the model it checks them against.
//!
//! **Model.** Each record id is a register: absent, or present with a value (the record's `v`
//! attribute, unique per write). Register(v) succeeds on an absent record and sets v, or fails
//! with ALREADY_EXISTS on a present one; Update(v) sets v on a present record or fails with
//! NOT_FOUND; Remove makes a present record absent or fails with NOT_FOUND; Read returns the
//! value or absent. A definite failure is an outcome like any other: the model must explain it.
//!
//! Requests that never left the client (no connection) had no effect and are left out.
//!
//! **Indeterminate operations** (a timeout, UNAVAILABLE: the write may have been applied, now
//! or later) are treated as Knossos and Porcupine do: they never return (their return is after
//! everything else), so they may take effect at any point after their invocation, or never;
//! their outcome is whatever the model gives. An indeterminate read constrains nothing and is
//! dropped; so is an indeterminate Update whose value no read ever returned (it can always be
//! placed last, after everything, without changing any other operation's outcome, since an
//! update never changes whether the record exists).
//!
//! **Search.** The history is split per record id (linearizability is compositional: a history
//! is linearizable iff each object's sub-history is), then each part is searched as by Wing and
//! Gong with Lowe's memoization, as Porcupine does: calls and returns sorted by time in a
//! doubly linked list; the search repeatedly linearizes the first call it can (one whose model
//! step matches its outcome) and lifts it and its return out of the list; reaching a return
//! whose call is still in the list means that operation could not be placed, so the search
//! backtracks. A (set of linearized operations, model state) pair already explored is never
//! explored again, which keeps the search polynomial in practice.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;

/// Nanoseconds since the start of the test.
pub type Time = u64;

/// What a client asked for.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Call {
    Register(String),
    Update(String),
    Remove,
    Read,
}

/// How it ended.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// Acknowledged (register, update, remove).
    Ok,
    /// A read's answer: the record's value, or `None` when there is no record.
    Read(Option<String>),
    /// ALREADY_EXISTS: a register that changed nothing.
    AlreadyExists,
    /// NOT_FOUND: an update or remove that changed nothing.
    NotFound,
    /// Timeout, UNAVAILABLE, a broken connection: it may or may not have taken effect.
    Unknown,
    /// The request never left the client (no connection could be made): it had no effect and
    /// constrains nothing. Kept in the history for the record; the checker leaves it out.
    NotSent,
}

/// One operation of the history.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Op {
    pub client: usize,
    pub key: String,
    pub call: Call,
    pub invoked: Time,
    /// When the answer came; `None` for an indeterminate operation.
    pub completed: Option<Time>,
    pub outcome: Outcome,
}

impl Op {
    fn is_write(&self) -> bool {
        !matches!(self.call, Call::Read)
    }

    /// Definitely changed nothing (a definite failure, or a read).
    fn changed_nothing(&self) -> bool {
        matches!(
            self.outcome,
            Outcome::AlreadyExists | Outcome::NotFound | Outcome::Read(_) | Outcome::NotSent
        )
    }

    /// The record after this write, when it was acknowledged.
    fn acked_effect(&self) -> Option<Option<&str>> {
        match (&self.call, &self.outcome) {
            (Call::Register(v) | Call::Update(v), Outcome::Ok) => Some(Some(v.as_str())),
            (Call::Remove, Outcome::Ok) => Some(None),
            _ => None,
        }
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = |t: Time| t as f64 / 1e6;
        let call = match &self.call {
            Call::Register(v) => format!("register({v})"),
            Call::Update(v) => format!("update({v})"),
            Call::Remove => "remove".into(),
            Call::Read => "read".into(),
        };
        let outcome = match &self.outcome {
            Outcome::Ok => "ok".into(),
            Outcome::Read(Some(v)) => format!("-> {v}"),
            Outcome::Read(None) => "-> absent".into(),
            Outcome::AlreadyExists => "ALREADY_EXISTS".into(),
            Outcome::NotFound => "NOT_FOUND".into(),
            Outcome::Unknown => "indeterminate".into(),
            Outcome::NotSent => "not sent".into(),
        };
        match self.completed {
            Some(c) => write!(
                f,
                "[{:>13.6} .. {:>13.6} ms] client {:>2} {} {call} {outcome}",
                ms(self.invoked),
                ms(c),
                self.client,
                self.key
            ),
            None => write!(
                f,
                "[{:>13.6} .. {:>13} ms] client {:>2} {} {call} {outcome}",
                ms(self.invoked),
                "never",
                self.client,
                self.key
            ),
        }
    }
}

impl std::str::FromStr for Op {
    type Err = String;

    /// Reads back what `Display` wrote (a saved history), to check it again.
    fn from_str(line: &str) -> Result<Op, String> {
        let bad = || format!("not an operation: {line:?}");
        let rest = line.trim().strip_prefix('[').ok_or_else(bad)?;
        let (times, rest) = rest.split_once(" ms] client ").ok_or_else(bad)?;
        let (a, b) = times.split_once("..").ok_or_else(bad)?;
        let ns = |t: &str| -> Result<Time, String> {
            let ms: f64 = t.trim().parse().map_err(|_| bad())?;
            Ok((ms * 1e6).round() as Time)
        };
        let words: Vec<&str> = rest.split_whitespace().collect();
        let [client, key, call, outcome @ ..] = words.as_slice() else {
            return Err(bad());
        };
        let arg = |c: &str, name: &str| {
            c.strip_prefix(name)
                .and_then(|r| r.strip_prefix('('))
                .and_then(|r| r.strip_suffix(')'))
                .map(String::from)
        };
        let call = match *call {
            "remove" => Call::Remove,
            "read" => Call::Read,
            c => match (arg(c, "register"), arg(c, "update")) {
                (Some(v), _) => Call::Register(v),
                (_, Some(v)) => Call::Update(v),
                _ => return Err(bad()),
            },
        };
        let outcome = match outcome {
            ["ok"] => Outcome::Ok,
            ["->", "absent"] => Outcome::Read(None),
            ["->", v] => Outcome::Read(Some(v.to_string())),
            ["ALREADY_EXISTS"] => Outcome::AlreadyExists,
            ["NOT_FOUND"] => Outcome::NotFound,
            ["indeterminate"] => Outcome::Unknown,
            ["not", "sent"] => Outcome::NotSent,
            _ => return Err(bad()),
        };
        Ok(Op {
            client: client.parse().map_err(|_| bad())?,
            key: key.to_string(),
            call,
            invoked: ns(a)?,
            completed: if b.trim() == "never" { None } else { Some(ns(b)?) },
            outcome,
        })
    }
}

/// The model's state: absent, or present with an interned value.
type State = Option<u32>;

/// An operation prepared for the search: values interned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    Register(u32),
    Update(u32),
    Remove,
    Read(State),
}

/// The model: `Some(next state)` when `op` with `outcome` can happen in `state`.
fn step(state: State, op: Step, outcome: &Outcome) -> Option<State> {
    use Outcome as O;
    match (op, outcome) {
        (Step::Register(v), O::Ok) => state.is_none().then_some(Some(v)),
        (Step::Register(_), O::AlreadyExists) => state.is_some().then_some(state),
        (Step::Register(v), O::Unknown) => Some(state.or(Some(v))),
        (Step::Update(v), O::Ok) => state.is_some().then_some(Some(v)),
        (Step::Update(_), O::NotFound) => state.is_none().then_some(state),
        (Step::Update(v), O::Unknown) => Some(state.map(|_| v)),
        (Step::Remove, O::Ok) => state.is_some().then_some(None),
        (Step::Remove, O::NotFound) => state.is_none().then_some(None),
        (Step::Remove, O::Unknown) => Some(None),
        (Step::Read(seen), O::Read(_)) => (state == seen).then_some(state),
        _ => None,
    }
}

/// Why a history is not linearizable, for one record id: its operations and the longest
/// linearization found, with the operations none of which could come next.
#[derive(Debug)]
pub struct Violation {
    pub key: String,
    /// The key's operations in invocation order.
    pub ops: Vec<Op>,
    /// The longest sequence of operations (indices into `ops`) the search could linearize.
    pub longest: Vec<usize>,
    /// The model state after `longest`.
    pub state: Option<String>,
    /// Operations not in `longest` whose call had been reached when the search got stuck.
    pub stuck: Vec<usize>,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "record {} is not linearizable.", self.key)?;
        writeln!(f, "its {} operations:", self.ops.len())?;
        for (i, op) in self.ops.iter().enumerate() {
            writeln!(f, "  #{i:<4} {op}")?;
        }
        writeln!(
            f,
            "longest linearization found ({} operations):",
            self.longest.len()
        )?;
        for i in &self.longest {
            writeln!(f, "  #{i:<4} {}", self.ops[*i])?;
        }
        writeln!(f, "state after it: {}", self.state.as_deref().unwrap_or("absent"))?;
        writeln!(f, "none of these can come next:")?;
        for i in &self.stuck {
            writeln!(f, "  #{i:<4} {}", self.ops[*i])?;
        }
        Ok(())
    }
}

/// What the checker concluded.
#[derive(Debug)]
pub enum Verdict {
    /// Every record's history is linearizable.
    Linearizable(Stats),
    NotLinearizable(Box<Violation>),
    /// The search for one record exceeded its step budget: nothing was proved.
    Unknown {
        key: String,
        steps: u64,
    },
}

/// Effort, for the report.
#[derive(Debug, Default, Clone)]
pub struct Stats {
    pub keys: usize,
    /// Operations searched (after dropping the ones that cannot matter).
    pub ops: usize,
    /// Search steps over all keys.
    pub steps: u64,
    /// (linearized set, state) pairs remembered, over all keys.
    pub cache: usize,
}

/// Checks `history` against the model, each record id on its own, with at most `budget` search
/// steps per record.
pub fn check(history: &[Op], budget: u64) -> Verdict {
    let mut by_key: BTreeMap<&str, Vec<Op>> = BTreeMap::new();
    for op in history {
        by_key.entry(op.key.as_str()).or_default().push(op.clone());
    }
    let mut stats = Stats::default();
    for (key, mut ops) in by_key {
        ops.sort_by_key(|o| (o.invoked, o.completed.unwrap_or(Time::MAX)));
        match check_key(&ops, budget) {
            KeyResult::Ok { ops: n, steps, cache } => {
                stats.keys += 1;
                stats.ops += n;
                stats.steps += steps;
                stats.cache += cache;
            }
            KeyResult::Violation {
                longest,
                state,
                stuck,
            } => {
                return Verdict::NotLinearizable(Box::new(Violation {
                    key: key.to_string(),
                    ops,
                    longest,
                    state,
                    stuck,
                }))
            }
            KeyResult::OutOfBudget { steps } => {
                return Verdict::Unknown {
                    key: key.to_string(),
                    steps,
                }
            }
        }
    }
    Verdict::Linearizable(stats)
}

enum KeyResult {
    Ok {
        ops: usize,
        steps: u64,
        cache: usize,
    },
    Violation {
        longest: Vec<usize>,
        state: Option<String>,
        stuck: Vec<usize>,
    },
    OutOfBudget {
        steps: u64,
    },
}

const NIL: usize = usize::MAX;
/// The one value every write no read ever returned stands for.
const UNOBSERVED: u32 = 0;

/// One record's history, in invocation order.
fn check_key(all: &[Op], budget: u64) -> KeyResult {
    let read_values: HashSet<&str> = all
        .iter()
        .filter_map(|o| match &o.outcome {
            Outcome::Read(Some(v)) => Some(v.as_str()),
            _ => None,
        })
        .collect();
    // Values are interned. A value no read returned is UNOBSERVED: the model cannot tell such
    // values apart (reads compare values, everything else only asks whether the record
    // exists), so their states merge. A read of a value no write carried gets an id of its
    // own, which no state ever holds.
    let mut values: HashMap<&str, u32> = HashMap::new();
    let mut intern = |v: &str| -> u32 {
        let Some(&seen) = read_values.get(v) else {
            return UNOBSERVED;
        };
        let n = values.len() as u32 + 1;
        *values.entry(seen).or_insert(n)
    };
    // What cannot matter is left out (see the module doc).
    let kept: Vec<usize> = (0..all.len())
        .filter(|i| {
            let o = &all[*i];
            match (&o.call, &o.outcome) {
                (_, Outcome::NotSent) => false,
                (Call::Read, Outcome::Unknown) => false,
                (Call::Update(v), Outcome::Unknown) => read_values.contains(v.as_str()),
                _ => true,
            }
        })
        .collect();
    let steps_of: Vec<Step> = kept
        .iter()
        .map(|i| match (&all[*i].call, &all[*i].outcome) {
            (Call::Register(v), _) => Step::Register(intern(v)),
            (Call::Update(v), _) => Step::Update(intern(v)),
            (Call::Remove, _) => Step::Remove,
            (Call::Read, Outcome::Read(v)) => Step::Read(v.as_deref().map(&mut intern)),
            // A read with an outcome that is not a read's never matches.
            (Call::Read, _) => Step::Read(Some(u32::MAX)),
        })
        .collect();
    let mut names: HashMap<u32, String> = values.iter().map(|(k, v)| (*v, k.to_string())).collect();
    names.insert(UNOBSERVED, "(a value no read returned)".into());
    let n = kept.len();
    let indeterminate: Vec<bool> = kept.iter().map(|i| all[*i].completed.is_none()).collect();

    // Entries: node 0 is the head; node 1 + 2k is op k's call, 2 + 2k its return.
    let call_node = |k: usize| 1 + 2 * k;
    let ret_node = |k: usize| 2 + 2 * k;
    let op_of = |node: usize| (node - 1) / 2;
    let is_call = |node: usize| node % 2 == 1;
    let mut events: Vec<(Time, bool, usize)> = Vec::with_capacity(2 * n);
    for (k, i) in kept.iter().enumerate() {
        let o = &all[*i];
        events.push((o.invoked, false, call_node(k)));
        // A return at the same time as a call sorts after it (they count as concurrent).
        events.push((o.completed.unwrap_or(Time::MAX), true, ret_node(k)));
    }
    events.sort();
    let mut next = vec![NIL; 2 * n + 1];
    let mut prev = vec![NIL; 2 * n + 1];
    let mut last = 0;
    for (_, _, node) in &events {
        next[last] = *node;
        prev[*node] = last;
        last = *node;
    }

    let words = n.div_ceil(64).max(1);
    let mut linearized = vec![0u64; words];
    let mut cache: HashSet<(Vec<u64>, State)> = HashSet::new();
    // (call node, state before it)
    let mut stack: Vec<(usize, State)> = Vec::new();
    let mut state: State = None;
    // The deepest point the search reached: (linearization, state, candidates); kept for the
    // report, replaced only by a strictly deeper one.
    let mut best: Option<(Vec<usize>, State, Vec<usize>)> = None;
    let mut steps: u64 = 0;
    // Done when every operation that completed is linearized: the indeterminate ones left
    // never took effect (or took effect after everything, unseen).
    let mut left = indeterminate.iter().filter(|i| !**i).count();
    let mut cur = next[0];

    while left > 0 {
        steps += 1;
        if steps > budget {
            return KeyResult::OutOfBudget { steps };
        }
        if is_call(cur) {
            let k = op_of(cur);
            let mut next_state = step(state, steps_of[k], &all[kept[k]].outcome);
            if indeterminate[k] {
                // Two reductions, both sound because an indeterminate operation may always be
                // left for the end instead (where whatever it does goes unseen): one that
                // would change nothing here is not placed here; and of indeterminate
                // operations with the same step, both invoked by now, only the earliest is
                // tried (swapping two such operations in a linearization keeps it valid).
                let twin_before = {
                    let mut node = prev[cur];
                    let mut found = false;
                    while node != 0 {
                        if is_call(node) && indeterminate[op_of(node)] && steps_of[op_of(node)] == steps_of[k]
                        {
                            found = true;
                            break;
                        }
                        node = prev[node];
                    }
                    found
                };
                if next_state == Some(state) || twin_before {
                    next_state = None;
                }
            }
            if let Some(s) = next_state {
                linearized[k / 64] |= 1 << (k % 64);
                if cache.insert((linearized.clone(), s)) {
                    stack.push((cur, state));
                    state = s;
                    if !indeterminate[k] {
                        left -= 1;
                    }
                    // Lift the call and its return out of the list.
                    let r = ret_node(k);
                    for node in [cur, r] {
                        let (p, x) = (prev[node], next[node]);
                        next[p] = x;
                        if x != NIL {
                            prev[x] = p;
                        }
                    }
                    cur = next[0];
                    continue;
                }
                linearized[k / 64] &= !(1 << (k % 64));
            }
            cur = next[cur];
        } else {
            // A return whose call is still listed: that operation cannot be placed here.
            if best.as_ref().is_none_or(|b| stack.len() > b.0.len()) {
                let mut stuck = Vec::new();
                let mut node = next[0];
                while node != NIL && node != cur {
                    if is_call(node) {
                        stuck.push(kept[op_of(node)]);
                    }
                    node = next[node];
                }
                let seq = stack.iter().map(|(c, _)| kept[op_of(*c)]).collect();
                best = Some((seq, state, stuck));
            }
            let Some((call, before)) = stack.pop() else {
                let (longest, state, stuck) = best.unwrap_or_default();
                return KeyResult::Violation {
                    longest,
                    state: state.map(|v| names.get(&v).cloned().unwrap_or_default()),
                    stuck,
                };
            };
            state = before;
            let k = op_of(call);
            linearized[k / 64] &= !(1 << (k % 64));
            if !indeterminate[k] {
                left += 1;
            }
            // Put the return back, then the call (the reverse of lifting).
            for node in [ret_node(k), call] {
                let (p, x) = (prev[node], next[node]);
                next[p] = node;
                if x != NIL {
                    prev[x] = node;
                }
            }
            cur = next[call];
        }
    }
    KeyResult::Ok {
        ops: n,
        steps,
        cache: cache.len(),
    }
}

/// Acknowledged writes the final state contradicts although nothing could have come after
/// them: for each record, an acknowledged write W is lost when `finals[key]` is not W's
/// effect and no other operation on the record that may have changed it (an acknowledged or
/// indeterminate write) could have taken effect after W (i.e. every such operation completed
/// before W was invoked). `finals` holds the value of each record read after the run
/// (`None`: absent); records missing from `finals` are not judged.
pub fn lost_writes<'a>(history: &'a [Op], finals: &BTreeMap<String, Option<String>>) -> Vec<&'a Op> {
    let mut lost = Vec::new();
    for w in history {
        let Some(effect) = w.acked_effect() else {
            continue;
        };
        let Some(fin) = finals.get(&w.key) else {
            continue;
        };
        if fin.as_deref() == effect {
            continue;
        }
        let superseded = history.iter().any(|o| {
            !std::ptr::eq(o, w)
                && o.key == w.key
                && o.is_write()
                && !o.changed_nothing()
                && o.completed.is_none_or(|c| c >= w.invoked)
        });
        if !superseded {
            lost.push(w);
        }
    }
    lost
}
