#![allow(clippy::unwrap_used)]

use std::cell::Cell;

use proptest::prelude::*;

use super::*;

const S: Settings = Settings {
    period_ms: 100,
    timeout_ms: 1000,
    peers_per_turn: 1,
};

fn tok(generation: u64, origin: &str, seq: u64, holder: &str) -> Token {
    Token {
        generation,
        origin: origin.into(),
        seq,
        holder: holder.into(),
    }
}

fn member(me: &str, all: &[&str]) -> Clique {
    let mut c = Clique::new(me, S, 0);
    c.set_members(all.iter().map(|s| s.to_string()));
    c
}

#[test]
fn tokens_are_totally_ordered() {
    assert!(
        tok(2, "z", 0, "z").newer_than(&tok(1, "a", 99, "a")),
        "generation first"
    );
    assert!(
        tok(1, "a", 0, "a").newer_than(&tok(1, "b", 50, "b")),
        "same generation: the lower origin wins"
    );
    assert!(tok(1, "a", 5, "c").newer_than(&tok(1, "a", 4, "b")), "then seq");
    assert!(
        tok(1, "a", 5, "b").newer_than(&tok(1, "a", 5, "c")),
        "a duplicated pass: the lower holder wins"
    );
    let t = tok(3, "a", 7, "b");
    assert!(!t.newer_than(&t.clone()), "strict");
    assert_eq!(t.label(), "3.7");
}

#[test]
fn one_turn_then_the_pass_goes_to_the_next_member() {
    let all = ["a", "b", "c"];
    let mut a = member("a", &all);
    let mut b = member("b", &all);
    assert_eq!(a.next_wakeup(), Some(1000), "rank 0 waits one timeout");
    assert_eq!(b.next_wakeup(), Some(2000), "rank 1 waits two");
    assert!(a.tick(999).is_empty());
    let acts = a.tick(1000);
    let t1 = tok(1, "a", 0, "a");
    assert_eq!(
        acts,
        [Action::Notify {
            turn: 1,
            token: t1.clone(),
            to: vec!["b".into(), "c".into()]
        }]
    );
    assert_eq!(a.stats().regenerated, 1);
    // b hears the notice: its wait starts again, and now a is the last known holder.
    let (ans, acts) = b.on_notice(&t1, 1001);
    assert_eq!(ans, Some(t1.clone()));
    assert!(acts.is_empty());
    assert_eq!(b.rank(), 0, "the holder a is left out of the ranks");
    assert_eq!(b.next_wakeup(), Some(2001));
    let acts = a.notices_done(1, &[ans, None], 1002);
    assert_eq!(
        acts,
        [Action::Probe {
            turn: 1,
            token: t1.clone(),
            targets: vec!["b".into()]
        }]
    );
    a.probe_done(1);
    assert_eq!(a.phase(), Phase::Resting);
    assert!(a.tick(1099).is_empty(), "a turn lasts period_ms");
    let acts = a.tick(1100);
    let t2 = tok(1, "a", 1, "b");
    assert_eq!(
        acts,
        [Action::Pass {
            turn: 1,
            to: "b".into(),
            token: t2.clone()
        }]
    );
    let (ok, newest, acts) = b.on_pass(&t2, 1101);
    assert!(ok);
    assert_eq!(newest, Some(t2.clone()));
    assert!(matches!(&acts[..], [Action::Notify { turn: 1, to, .. }] if to == &["a", "c"]));
    // The same pass again (a retry after a lost answer) is accepted and changes nothing.
    assert_eq!(b.on_pass(&t2, 1102), (true, Some(t2.clone()), vec![]));
    assert_eq!((b.turn(), b.stats().dropped), (1, 0));
    assert!(a.pass_result(1, "b", PassOutcome::Accepted, 1102).is_empty());
    assert_eq!(a.phase(), Phase::Idle);
    assert_eq!(a.newest(), Some(&t2));
    assert_eq!(a.stats().passes, 1);
}

#[test]
fn the_holder_probes_its_peers_round_robin() {
    let all = ["a", "b", "c", "d"];
    let mut a = member("a", &all);
    let mut targets = Vec::new();
    a.tick(1000);
    for turn in 1..=6u64 {
        let acts = a.notices_done(turn, &[], 1000 + turn);
        match &acts[..] {
            [Action::Probe { targets: t, .. }] => targets.extend(t.clone()),
            other => panic!("turn {turn}: {other:?}"),
        }
        a.probe_done(turn);
        // Nobody takes the token: every pass fails, a keeps it for another turn.
        let mut acts = a.tick(2000 * turn);
        while let [Action::Pass { turn: t, to, .. }] = &acts[..] {
            acts = a.pass_result(*t, &to.clone(), PassOutcome::Failed, 2000 * turn);
        }
        assert!(matches!(&acts[..], [Action::Notify { .. }]), "{acts:?}");
    }
    assert_eq!(targets, ["b", "c", "d", "b", "c", "d"]);
    assert_eq!(a.newest().unwrap().seq, 6, "each kept turn has a new seq");
    assert_eq!(a.stats().pass_failures, 18);
}

#[test]
fn a_stale_pass_is_refused_and_a_newer_notice_drops_the_holder() {
    let all = ["a", "b", "c"];
    let mut b = member("b", &all);
    b.on_notice(&tok(2, "a", 5, "a"), 10);
    let (ok, newest, acts) = b.on_pass(&tok(1, "c", 9, "b"), 11);
    assert!(!ok && acts.is_empty());
    assert_eq!(newest, Some(tok(2, "a", 5, "a")));
    assert_eq!(b.stats().dropped, 1);
    // b takes a newer token and probes ...
    let (ok, _, _) = b.on_pass(&tok(2, "a", 6, "b"), 12);
    assert!(ok);
    let acts = b.notices_done(1, &[None, None], 13);
    assert!(matches!(&acts[..], [Action::Probe { turn: 1, .. }]));
    // ... until a regenerated (newer) token shows up: it drops its own and stops probing.
    let (_, acts) = b.on_notice(&tok(3, "c", 0, "c"), 14);
    assert_eq!(acts, [Action::Abort { turn: 1 }]);
    assert_eq!(b.phase(), Phase::Idle);
    assert_eq!(b.stats().dropped, 2);
    // Its later results are ignored.
    b.probe_done(1);
    assert!(b.pass_result(1, "c", PassOutcome::Accepted, 15).is_empty());
    assert_eq!(b.phase(), Phase::Idle);
}

#[test]
fn a_notice_of_the_receiver_overtaking_the_pass_answer_is_no_duplicate() {
    let all = ["a", "b"];
    let mut a = member("a", &all);
    a.tick(1000);
    a.notices_done(1, &[None], 1001);
    a.probe_done(1);
    let acts = a.tick(1100);
    let [Action::Pass { token, .. }] = &acts[..] else {
        panic!("{acts:?}")
    };
    // b took it and notified before the answer to the pass came back.
    a.on_notice(token, 1101);
    assert_eq!(a.phase(), Phase::Idle);
    assert_eq!((a.stats().passes, a.stats().dropped), (1, 0));
    assert!(a.pass_result(1, "b", PassOutcome::Accepted, 1102).is_empty());
    assert_eq!(a.stats().passes, 1);
}

#[test]
fn a_refused_pass_drops_the_token() {
    let all = ["a", "b"];
    let mut a = member("a", &all);
    a.tick(1000);
    a.notices_done(1, &[None], 1001);
    a.probe_done(1);
    let acts = a.tick(1100);
    assert!(matches!(&acts[..], [Action::Pass { .. }]));
    let newer = tok(2, "b", 0, "b");
    a.pass_result(1, "b", PassOutcome::Rejected(Some(newer.clone())), 1101);
    assert_eq!(a.phase(), Phase::Idle);
    assert_eq!(a.newest(), Some(&newer));
    assert_eq!(a.stats().dropped, 1);
}

#[test]
fn leaving_hands_the_token_on() {
    let all = ["a", "b", "c"];
    let mut a = member("a", &all);
    a.tick(1000);
    a.notices_done(1, &[None, None], 1001);
    let acts = a.leave(1002);
    assert_eq!(acts[0], Action::Abort { turn: 1 });
    assert!(matches!(&acts[1], Action::Pass { to, .. } if to == "b"));
    let mut idle = member("b", &all);
    assert!(idle.leave(5).is_empty());
}

/// An in-memory clique: members run the real state machine; the network delays, loses and
/// duplicates messages; members crash and join; the directory forgets the dead after a lease.
mod sim {
    use std::cmp::Reverse as Rev;
    use std::collections::{BinaryHeap, HashMap};

    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    use super::super::*;

    #[derive(Clone, Copy)]
    pub struct Faults {
        pub max_delay_ms: u64,
        /// A notice (or its answer) is lost; the sender sees a timeout.
        pub notice_loss: f64,
        /// A pass arrives but its answer is lost: the sender tries the next member (a
        /// duplicated token).
        pub pass_answer_loss: f64,
        /// No faults of the two kinds above after this time.
        pub faults_until_ms: u64,
    }

    /// (node, start, end) of a probe.
    pub type Interval = (usize, u64, u64);

    const RPC_TIMEOUT_MS: u64 = 50;
    const LEASE_MS: u64 = 400;
    const MAX_PROBE_MS: u64 = 30;

    enum Ev {
        Tick(usize),
        Notice {
            from: usize,
            to: usize,
            token: Token,
            turn: u64,
            lost: bool,
        },
        NoticeAnswer {
            to: usize,
            turn: u64,
            answer: Option<Token>,
        },
        Pass {
            from: usize,
            to: usize,
            token: Token,
            turn: u64,
            lose_answer: bool,
        },
        PassAnswer {
            to: usize,
            turn: u64,
            target: String,
            outcome: PassOutcome,
        },
        ProbeEnd {
            node: usize,
            turn: u64,
        },
        Crash(usize),
        Join(usize),
        /// `observer`'s directory view changes: `who` is now (in)visible.
        View {
            observer: usize,
            who: usize,
            present: bool,
        },
    }

    struct Node {
        c: Clique,
        alive: bool,
        joined: bool,
        /// Members this node's directory view shows.
        view: BTreeSet<usize>,
        notify: Option<(u64, usize, Vec<Option<Token>>)>,
        probing: Option<(u64, u64)>,
        next_tick: Option<u64>,
    }

    pub struct Sim {
        pub now: u64,
        seq: u64,
        queue: BinaryHeap<Rev<(u64, u64)>>,
        events: HashMap<u64, Ev>,
        nodes: Vec<Node>,
        rng: ChaCha8Rng,
        f: Faults,
        /// Every probe.
        pub probes: Vec<Interval>,
        /// Passes on the wire: event id -> (from, to).
        in_flight: HashMap<u64, (usize, usize)>,
        /// Regenerations while another live token existed (must stay empty without faults).
        pub needless_regenerations: Vec<(u64, usize)>,
        /// Crashes that lost the token.
        pub losses: u64,
        pub crashes: Vec<u64>,
    }

    fn name(i: usize) -> String {
        format!("m{i:02}")
    }

    impl Sim {
        pub fn new(seed: u64, n: usize, f: Faults) -> Sim {
            let s = Settings {
                period_ms: 100,
                timeout_ms: 1000,
                peers_per_turn: 1,
            };
            let nodes = (0..n)
                .map(|i| Node {
                    c: Clique::new(&name(i), s, 0),
                    alive: false,
                    joined: false,
                    view: BTreeSet::new(),
                    notify: None,
                    probing: None,
                    next_tick: None,
                })
                .collect();
            Sim {
                now: 0,
                seq: 0,
                queue: BinaryHeap::new(),
                events: HashMap::new(),
                nodes,
                rng: ChaCha8Rng::seed_from_u64(seed),
                f,
                probes: Vec::new(),
                in_flight: HashMap::new(),
                needless_regenerations: Vec::new(),
                losses: 0,
                crashes: Vec::new(),
            }
        }

        fn at(&mut self, t: u64, ev: Ev) -> u64 {
            self.seq += 1;
            self.queue.push(Rev((t, self.seq)));
            self.events.insert(self.seq, ev);
            self.seq
        }

        fn delay(&mut self) -> u64 {
            self.rng.random_range(0..=self.f.max_delay_ms)
        }

        fn faulty(&self) -> bool {
            self.now < self.f.faults_until_ms
        }

        pub fn join(&mut self, t: u64, i: usize) {
            self.at(t, Ev::Join(i));
        }

        pub fn crash(&mut self, t: u64, i: usize) {
            self.at(t, Ev::Crash(i));
        }

        /// Live members holding a token, not counting a sender whose pass has arrived (the
        /// receiver has it, or knows a newer one: the sender drops it when the answer comes).
        pub fn holders(&self) -> Vec<usize> {
            (0..self.nodes.len())
                .filter(|i| {
                    let n = &self.nodes[*i];
                    if !n.alive || !n.c.holding() {
                        return false;
                    }
                    match (&n.c.phase, &n.c.passing) {
                        (Phase::Passing, Some(p)) => {
                            let target = &self.nodes[self.index(&p.holder)].c;
                            target.newest().is_none_or(|t| p.newer_than(t))
                        }
                        _ => true,
                    }
                })
                .collect()
        }

        /// Tokens alive: live holders plus passes from dead members on the way to live ones.
        pub fn live_tokens(&self) -> usize {
            let orphans = self
                .in_flight
                .values()
                .filter(|(from, to)| !self.nodes[*from].alive && self.nodes[*to].alive)
                .count();
            self.holders().len() + orphans
        }

        pub fn dropped(&self) -> u64 {
            self.nodes.iter().map(|n| n.c.stats().dropped).sum()
        }

        pub fn regenerations(&self) -> u64 {
            self.nodes.iter().map(|n| n.c.stats().regenerated).sum()
        }

        fn apply_view(&mut self, i: usize) {
            let members: Vec<String> = self.nodes[i].view.iter().map(|j| name(*j)).collect();
            self.nodes[i].c.set_members(members);
        }

        fn exec(&mut self, i: usize, actions: Vec<Action>) {
            for a in actions {
                match a {
                    Action::Notify { turn, token, to } => {
                        self.nodes[i].notify = Some((turn, to.len(), Vec::new()));
                        for t in to {
                            let j = self.index(&t);
                            let lost = self.faulty() && self.rng.random_bool(self.f.notice_loss);
                            let d = self.delay();
                            self.at(
                                self.now + d,
                                Ev::Notice {
                                    from: i,
                                    to: j,
                                    token: token.clone(),
                                    turn,
                                    lost,
                                },
                            );
                        }
                    }
                    Action::Probe { turn, targets, .. } => {
                        self.nodes[i].probing = Some((turn, self.now));
                        let d: u64 = targets
                            .iter()
                            .map(|_| self.rng.random_range(1..=MAX_PROBE_MS))
                            .sum();
                        self.at(self.now + d, Ev::ProbeEnd { node: i, turn });
                    }
                    Action::Abort { turn } => {
                        if let Some((t, start)) = self.nodes[i].probing {
                            if t == turn {
                                self.probes.push((i, start, self.now));
                                self.nodes[i].probing = None;
                            }
                        }
                    }
                    Action::Pass { turn, to, token } => {
                        let j = self.index(&to);
                        let lose_answer = self.faulty() && self.rng.random_bool(self.f.pass_answer_loss);
                        let d = self.delay();
                        let id = self.at(
                            self.now + d,
                            Ev::Pass {
                                from: i,
                                to: j,
                                token,
                                turn,
                                lose_answer,
                            },
                        );
                        self.in_flight.insert(id, (i, j));
                    }
                }
            }
            self.schedule_tick(i);
        }

        fn index(&self, name: &str) -> usize {
            name[1..].parse().unwrap()
        }

        fn schedule_tick(&mut self, i: usize) {
            if !self.nodes[i].alive {
                return;
            }
            if let Some(w) = self.nodes[i].c.next_wakeup() {
                let w = w.max(self.now);
                if self.nodes[i].next_tick != Some(w) {
                    self.nodes[i].next_tick = Some(w);
                    self.at(w, Ev::Tick(i));
                }
            }
        }

        pub fn run_until(&mut self, end: u64) {
            while let Some(Rev((t, id))) = self.queue.peek().copied() {
                if t > end {
                    break;
                }
                self.queue.pop();
                self.now = t;
                let Some(ev) = self.events.remove(&id) else {
                    continue;
                };
                self.step(id, ev);
            }
            self.now = end;
        }

        fn step(&mut self, id: u64, ev: Ev) {
            let now = self.now;
            match ev {
                Ev::Tick(i) => {
                    if !self.nodes[i].alive || self.nodes[i].next_tick != Some(now) {
                        return;
                    }
                    self.nodes[i].next_tick = None;
                    let before = self.nodes[i].c.stats().regenerated;
                    let others = self.live_tokens();
                    let acts = self.nodes[i].c.tick(now);
                    if self.nodes[i].c.stats().regenerated > before && others > 0 {
                        self.needless_regenerations.push((now, i));
                    }
                    self.exec(i, acts);
                }
                Ev::Notice {
                    from,
                    to,
                    token,
                    turn,
                    lost,
                } => {
                    if lost {
                        let t = now + RPC_TIMEOUT_MS;
                        self.at(
                            t,
                            Ev::NoticeAnswer {
                                to: from,
                                turn,
                                answer: None,
                            },
                        );
                        return;
                    }
                    let answer = if self.nodes[to].alive {
                        let (ans, acts) = self.nodes[to].c.on_notice(&token, now);
                        self.exec(to, acts);
                        ans
                    } else {
                        None
                    };
                    let d = self.delay();
                    self.at(
                        now + d,
                        Ev::NoticeAnswer {
                            to: from,
                            turn,
                            answer,
                        },
                    );
                }
                Ev::NoticeAnswer { to, turn, answer } => {
                    if !self.nodes[to].alive {
                        return;
                    }
                    let done = match &mut self.nodes[to].notify {
                        Some((t, pending, answers)) if *t == turn => {
                            answers.push(answer);
                            *pending -= 1;
                            (*pending == 0).then(|| std::mem::take(answers))
                        }
                        _ => None,
                    };
                    if let Some(answers) = done {
                        self.nodes[to].notify = None;
                        let acts = self.nodes[to].c.notices_done(turn, &answers, now);
                        self.exec(to, acts);
                    }
                }
                Ev::Pass {
                    from,
                    to,
                    token,
                    turn,
                    lose_answer,
                } => {
                    self.in_flight.remove(&id);
                    let target = name(to);
                    let (outcome, wait) = if self.nodes[to].alive {
                        let (ok, newest, acts) = self.nodes[to].c.on_pass(&token, now);
                        self.exec(to, acts);
                        if lose_answer {
                            (PassOutcome::Failed, RPC_TIMEOUT_MS)
                        } else if ok {
                            (PassOutcome::Accepted, self.delay())
                        } else {
                            (PassOutcome::Rejected(newest), self.delay())
                        }
                    } else {
                        (PassOutcome::Failed, self.delay())
                    };
                    self.at(
                        now + wait,
                        Ev::PassAnswer {
                            to: from,
                            turn,
                            target,
                            outcome,
                        },
                    );
                }
                Ev::PassAnswer {
                    to,
                    turn,
                    target,
                    outcome,
                } => {
                    if self.nodes[to].alive {
                        let acts = self.nodes[to].c.pass_result(turn, &target, outcome, now);
                        self.exec(to, acts);
                    }
                }
                Ev::ProbeEnd { node, turn } => {
                    if !self.nodes[node].alive {
                        return;
                    }
                    if let Some((t, start)) = self.nodes[node].probing {
                        if t == turn {
                            self.probes.push((node, start, now));
                            self.nodes[node].probing = None;
                            self.nodes[node].c.probe_done(turn);
                            self.schedule_tick(node);
                        }
                    }
                }
                Ev::Crash(i) => {
                    if !self.nodes[i].alive {
                        return;
                    }
                    self.crashes.push(now);
                    self.nodes[i].alive = false;
                    if let Some((_, start)) = self.nodes[i].probing.take() {
                        self.probes.push((i, start, now));
                    }
                    let holding = self.nodes[i].c.holding();
                    let handed_on = self
                        .in_flight
                        .values()
                        .any(|(from, to)| *from == i && self.nodes[*to].alive);
                    if holding && !handed_on && self.holders().is_empty() {
                        self.losses += 1;
                    }
                    for j in 0..self.nodes.len() {
                        if j != i && self.nodes[j].joined {
                            let t = now + LEASE_MS + self.rng.random_range(0..=LEASE_MS / 2);
                            self.at(
                                t,
                                Ev::View {
                                    observer: j,
                                    who: i,
                                    present: false,
                                },
                            );
                        }
                    }
                }
                Ev::Join(i) => {
                    self.nodes[i].alive = true;
                    self.nodes[i].joined = true;
                    self.nodes[i].c = Clique::new(&name(i), self.nodes[i].c.s, now);
                    // The newcomer lists everyone alive at once; the others learn of it later.
                    let live: BTreeSet<usize> =
                        (0..self.nodes.len()).filter(|j| self.nodes[*j].alive).collect();
                    self.nodes[i].view = live;
                    self.apply_view(i);
                    for j in 0..self.nodes.len() {
                        if j != i && self.nodes[j].alive {
                            let t = now + self.rng.random_range(0..=LEASE_MS / 2);
                            self.at(
                                t,
                                Ev::View {
                                    observer: j,
                                    who: i,
                                    present: true,
                                },
                            );
                        }
                    }
                    self.schedule_tick(i);
                }
                Ev::View {
                    observer,
                    who,
                    present,
                } => {
                    if present {
                        self.nodes[observer].view.insert(who);
                    } else {
                        self.nodes[observer].view.remove(&who);
                    }
                    self.apply_view(observer);
                    self.schedule_tick(observer);
                }
            }
        }

        /// Overlapping probe intervals among those starting at or after `from`.
        pub fn overlaps(&self, from: u64) -> Vec<(Interval, Interval)> {
            let mut p: Vec<Interval> = self.probes.iter().copied().filter(|p| p.1 >= from).collect();
            p.sort_by_key(|x| (x.1, x.2));
            p.windows(2)
                .filter(|w| w[1].1 < w[0].2)
                .map(|w| (w[0], w[1]))
                .collect()
        }

        /// The first probe starting at or after `t`.
        pub fn first_probe_after(&self, t: u64) -> Option<u64> {
            self.probes.iter().map(|p| p.1).filter(|s| *s >= t).min()
        }
    }
}

use sim::{Faults, Sim};

/// Crash failures, message delays, joins and lagging directory views (no lost messages):
/// probes never overlap, a token is regenerated only when it was lost and then exactly once,
/// within the timeout, and exactly one token is alive at the end.
/// A crash: of the holder of the moment (when there is one), else of the member given.
type Crash = (bool, usize);

/// A crash scenario: the seed of the simulated network (its message delays are drawn as the
/// messages flow, so they stay a seed rather than a strategy), the join times of members 0-5
/// (0-299 ms) and of the late members 6 and 7 (3-5 s), and four crashes, each of the holder of
/// the moment (half of the time, when there is one) or else of the member given.
fn crash_scenario() -> impl Strategy<Value = (u64, [u64; 6], [u64; 2], [Crash; 4])> {
    (
        any::<u64>(),
        prop::array::uniform6(0..300u64),
        prop::array::uniform2(3000..5000u64),
        prop::array::uniform4((prop::bool::ANY, 0..8usize)),
    )
}

#[test]
fn property_crashes_never_overlap_probes_and_regenerate_exactly_once() {
    let faults = Faults {
        max_delay_ms: 5,
        notice_loss: 0.0,
        pass_answer_loss: 0.0,
        faults_until_ms: 0,
    };
    let total_probes = Cell::new(0);
    let total_losses = Cell::new(0);
    let config = ProptestConfig::with_cases(150);
    proptest!(config, |((seed, joins, late, crashes) in crash_scenario())| {
        let mut sim = Sim::new(seed, 8, faults);
        for (i, t) in joins.into_iter().enumerate() {
            sim.join(t, i);
        }
        sim.join(late[0], 6);
        sim.join(late[1], 7);
        // Crashes 2.5 s apart (more than a lease plus two timeouts): half of them hit the
        // holder of the moment, the others a given member.
        let mut t = 2000;
        sim.run_until(t);
        for (holder, member) in crashes {
            t += 2500;
            sim.run_until(t);
            let holders = sim.holders();
            let victim = if holder && !holders.is_empty() {
                holders[0]
            } else {
                member
            };
            sim.crash(t, victim);
        }
        sim.run_until(t + 4000);
        let overlaps = sim.overlaps(0);
        prop_assert!(overlaps.is_empty(), "overlapping probes {:?}", overlaps);
        prop_assert!(
            sim.needless_regenerations.is_empty(),
            "regenerated while a token was alive: {:?}",
            sim.needless_regenerations
        );
        prop_assert_eq!(
            sim.regenerations(),
            1 + sim.losses,
            "one initial token plus exactly one per lost token"
        );
        prop_assert_eq!(sim.live_tokens(), 1, "exactly one token at the end");
        prop_assert_eq!(sim.dropped(), 0, "no duplicate was ever made, none dropped");
        for c in &sim.crashes {
            let next = sim.first_probe_after(*c);
            prop_assert!(next.is_some(), "probing never resumed after the crash at {}", c);
            let next = next.unwrap_or_default();
            // Regeneration is due one timeout after the last evidence (<= the crash), then a
            // notice round (two delays) before the first probe; a surviving token needs at
            // most a turn (period + probe + failed pass).
            prop_assert!(
                next - c <= 1000 + 3 * 5 + 1,
                "probing resumed {} ms after the crash at {}",
                next - c,
                c
            );
        }
        total_probes.set(total_probes.get() + sim.probes.len());
        total_losses.set(total_losses.get() + sim.losses);
    });
    let (total_probes, total_losses) = (total_probes.get(), total_losses.get());
    eprintln!("{total_probes} probes, {total_losses} tokens lost to crashes");
    assert!(
        total_probes > 10_000,
        "the simulation probed {total_probes} times"
    );
    assert!(total_losses > 50, "crashes lost the token {total_losses} times");
}

/// Lost notices and duplicated passes (answers lost after delivery) make duplicate tokens and
/// needless regenerations; once the faults stop, exactly one token survives and probes no
/// longer overlap.
#[test]
fn property_duplicate_tokens_are_dropped_once_faults_stop() {
    let faults = Faults {
        max_delay_ms: 20,
        notice_loss: 0.3,
        pass_answer_loss: 0.2,
        faults_until_ms: 8000,
    };
    let duplicates_seen = Cell::new(0);
    // The scenario is fixed but for the simulated network (message delays and losses, drawn as
    // the messages flow): its seed is the input.
    let config = ProptestConfig::with_cases(150);
    proptest!(config, |(seed in any::<u64>())| {
        let mut sim = Sim::new(seed, 6, faults);
        for i in 0..6 {
            sim.join(i as u64 * 37, i);
        }
        let mut t = 0;
        let mut max_tokens = 0;
        while t < 8000 {
            t += 10;
            sim.run_until(t);
            max_tokens = max_tokens.max(sim.live_tokens());
        }
        if max_tokens > 1 {
            duplicates_seen.set(duplicates_seen.get() + 1);
        }
        // One turn of each holder is enough to meet the others; give it a timeout.
        t = 9000;
        sim.run_until(t);
        while t < 14_000 {
            t += 10;
            sim.run_until(t);
            prop_assert_eq!(sim.live_tokens(), 1, "tokens alive at {}", t);
        }
        let overlaps = sim.overlaps(9000);
        prop_assert!(overlaps.is_empty(), "overlaps after the faults: {:?}", overlaps);
    });
    let duplicates_seen = duplicates_seen.get();
    eprintln!("duplicate tokens in {duplicates_seen} of 150 runs");
    assert!(
        duplicates_seen > 30,
        "the faults made duplicate tokens in only {duplicates_seen} runs"
    );
}
