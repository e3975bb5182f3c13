//! The probing token of a clique, as a pure state machine: no I/O, no clock, no randomness.
//!
//! Hosts that share a segment form a clique (the live netprobes of one site in the directory).
//! A token circulates among them in member-id order; only its holder probes, and it probes one
//! peer after the other, so no two measurements on the segment overlap (GMA white paper,
//! lines 780–797; the Network Weather Service's cliques).
//!
//! The shell (`crate::service`) feeds this machine with what happens — a token passed in, a
//! notice, a membership change, the end of a probe, the outcome of a pass, the time — and
//! carries out the [`Action`]s it returns. Time is a monotonic count of milliseconds.
//!
//! # A turn
//!
//! The holder (1) sends a [`Action::Notify`] to every other member and waits for all answers
//! (or their timeouts), (2) probes [`Settings::peers_per_turn`] peers in round-robin order,
//! (3) rests until the turn is [`Settings::period_ms`] old, (4) passes the token to the next
//! member in id order (seq + 1), trying the one after it when a pass fails, and keeping the
//! token for another turn when nobody takes it.
//!
//! # To ensure correctness
//!
//! - **Order.** Tokens are totally ordered ([`Token::newer_than`]): higher generation, then
//!   lower origin id, then higher seq, then lower holder id. Every member remembers the newest
//!   token it has seen (`newest`) and accepts a pass only of a strictly newer token; a holder
//!   that learns of a newer token (a notice, a pass, the answer to one of its own messages)
//!   drops its own at once and aborts its probe. Two tokens can therefore only coexist until
//!   one of them reaches a member that has seen the other, and exactly the newest survives.
//! - **Handshake.** A holder probes only after every member answered its notice. Of two
//!   concurrent holders each must hear from the other first, and whichever of them processes
//!   the other's notice second has already seen the newer token: the older holder never
//!   probes (with crash failures and answers that arrive within the RPC timeout).
//! - **Loss.** Any strictly newer token seen is *evidence* the token is alive. A member that
//!   has none for [`Settings::timeout_ms`] regenerates the token with generation + 1 — but only
//!   the member of rank 0 does so after one timeout: ranks are positions in id order among the
//!   live members minus the last known holder (presumably the dead one), and rank r waits
//!   (r + 1) timeouts. The regenerator notifies everybody before probing, which resets every
//!   other member's wait: exactly one member regenerates a lost token. If members disagree on
//!   the ranks (directory views differ for a moment) and two regenerate, the order above keeps
//!   the one of the lower-id origin.
//! - **Timeout.** The timeout must exceed the longest turn (notices + probes + rest + passes;
//!   `NetprobeConfig::validate` checks it), or a slow turn is mistaken for a lost token.
//! - **Membership.** A member that left (lease expired) is neither probed nor passed to; a pass
//!   to a member that died before its lease expired fails and goes to the next one.

use std::cmp::Reverse;
use std::collections::BTreeSet;

/// The probing token.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Token {
    /// + 1 at every regeneration.
    pub generation: u64,
    /// The member that generated this token.
    pub origin: String,
    /// + 1 at every pass (and every turn a lone holder keeps it).
    pub seq: u64,
    /// The member that holds (or was handed) it.
    pub holder: String,
}

impl Token {
    fn key(&self) -> (u64, Reverse<&str>, u64, Reverse<&str>) {
        (
            self.generation,
            Reverse(self.origin.as_str()),
            self.seq,
            Reverse(self.holder.as_str()),
        )
    }

    /// The total order of tokens: a later generation, then (same generation: two members
    /// regenerated) the lower origin id, then a later seq, then (same seq: a pass was
    /// duplicated) the lower holder id.
    pub fn newer_than(&self, other: &Token) -> bool {
        self.key() > other.key()
    }

    /// `generation.seq`, as published with every measurement.
    pub fn label(&self) -> String {
        format!("{}.{}", self.generation, self.seq)
    }
}

/// Where a member is in its turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Not holding the token.
    Idle,
    /// Holding: notices sent, waiting for the answers.
    Notifying,
    /// Holding: probing peers.
    Probing,
    /// Holding: probes done, waiting for the turn to be `period_ms` old.
    Resting,
    /// Holding: a pass is under way.
    Passing,
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Idle => "idle",
            Phase::Notifying => "notifying",
            Phase::Probing => "probing",
            Phase::Resting => "resting",
            Phase::Passing => "passing",
        }
    }
}

/// What the shell must do. `turn` identifies the turn an action belongs to; results of an
/// older turn are ignored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Send a notice of `token` to each of `to`, then report every answer with
    /// [`Clique::notices_done`].
    Notify {
        turn: u64,
        token: Token,
        to: Vec<String>,
    },
    /// Probe `targets` one after the other, then call [`Clique::probe_done`].
    Probe {
        turn: u64,
        token: Token,
        targets: Vec<String>,
    },
    /// Stop the probe of `turn` now: the token was dropped.
    Abort { turn: u64 },
    /// Hand `token` to `to`, then report with [`Clique::pass_result`].
    Pass { turn: u64, to: String, token: Token },
}

/// The outcome of a pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PassOutcome {
    Accepted,
    /// The receiver has seen a newer token (given, if it said which).
    Rejected(Option<Token>),
    /// No answer (dead, unreachable, timed out).
    Failed,
}

/// Timing of the protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    /// Shortest turn: a holder passes the token no earlier than this after it got it.
    pub period_ms: u64,
    /// No evidence of the token for this long: the rank-0 member regenerates it.
    pub timeout_ms: u64,
    /// Peers probed per turn (round robin).
    pub peers_per_turn: usize,
}

/// Counters of one member.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    pub regenerated: u64,
    /// Tokens dropped as duplicates: passes refused plus own tokens given up.
    pub dropped: u64,
    pub turns: u64,
    pub passes: u64,
    pub pass_failures: u64,
}

/// One member's view of its clique's token.
#[derive(Debug, Clone)]
pub struct Clique {
    me: String,
    s: Settings,
    members: BTreeSet<String>,
    newest: Option<Token>,
    evidence_ms: u64,
    phase: Phase,
    turn: u64,
    turn_start_ms: u64,
    /// Members a pass of this turn failed to reach.
    tried: BTreeSet<String>,
    passing: Option<Token>,
    /// The last peer probed (round robin).
    cursor: Option<String>,
    stats: Stats,
}

impl Clique {
    /// A member that has seen no token yet, alone until [`Clique::set_members`].
    pub fn new(me: &str, s: Settings, now_ms: u64) -> Clique {
        Clique {
            me: me.to_string(),
            s,
            members: BTreeSet::from([me.to_string()]),
            newest: None,
            evidence_ms: now_ms,
            phase: Phase::Idle,
            turn: 0,
            turn_start_ms: now_ms,
            tried: BTreeSet::new(),
            passing: None,
            cursor: None,
            stats: Stats::default(),
        }
    }

    pub fn me(&self) -> &str {
        &self.me
    }

    pub fn phase(&self) -> Phase {
        self.phase
    }

    pub fn holding(&self) -> bool {
        self.phase != Phase::Idle
    }

    /// The newest token seen; while holding, the token held.
    pub fn newest(&self) -> Option<&Token> {
        self.newest.as_ref()
    }

    pub fn members(&self) -> &BTreeSet<String> {
        &self.members
    }

    pub fn stats(&self) -> Stats {
        self.stats
    }

    pub fn turn(&self) -> u64 {
        self.turn
    }

    pub fn turn_start_ms(&self) -> u64 {
        self.turn_start_ms
    }

    pub fn evidence_ms(&self) -> u64 {
        self.evidence_ms
    }

    /// The live members (from the directory). This member is always one of them.
    pub fn set_members(&mut self, members: impl IntoIterator<Item = String>) {
        self.members = members.into_iter().collect();
        self.members.insert(self.me.clone());
    }

    /// This member's place in the regeneration order: its position by id among the members
    /// other than the last known holder.
    pub fn rank(&self) -> usize {
        let holder = self.newest.as_ref().map(|t| t.holder.as_str());
        self.members
            .iter()
            .filter(|m| *m == &self.me || Some(m.as_str()) != holder)
            .position(|m| *m == self.me)
            .unwrap_or(0)
    }

    /// When [`Clique::tick`] has something to do, if nothing else happens first.
    pub fn next_wakeup(&self) -> Option<u64> {
        match self.phase {
            Phase::Idle => Some(self.regeneration_due()),
            Phase::Resting => Some(self.turn_start_ms.saturating_add(self.s.period_ms)),
            _ => None,
        }
    }

    fn regeneration_due(&self) -> u64 {
        let waits = self.rank() as u64 + 1;
        self.evidence_ms
            .saturating_add(self.s.timeout_ms.saturating_mul(waits))
    }

    /// Time passes: regenerate a lost token, or end a turn that has rested long enough.
    pub fn tick(&mut self, now_ms: u64) -> Vec<Action> {
        match self.phase {
            Phase::Idle if now_ms >= self.regeneration_due() => {
                let generation = self.newest.as_ref().map_or(0, |t| t.generation) + 1;
                self.newest = Some(Token {
                    generation,
                    origin: self.me.clone(),
                    seq: 0,
                    holder: self.me.clone(),
                });
                self.stats.regenerated += 1;
                self.evidence_ms = now_ms;
                self.start_turn(now_ms)
            }
            Phase::Resting if now_ms >= self.turn_start_ms.saturating_add(self.s.period_ms) => {
                self.tried.clear();
                self.next_pass(now_ms)
            }
            _ => Vec::new(),
        }
    }

    fn peers(&self) -> Vec<String> {
        self.members.iter().filter(|m| **m != self.me).cloned().collect()
    }

    /// Members in ring order after `after` (wrapping), `after` and this member excluded.
    fn ring_after(&self, after: &str) -> Vec<String> {
        let peers = self.peers();
        let split = peers.partition_point(|m| m.as_str() <= after);
        peers[split..].iter().chain(&peers[..split]).cloned().collect()
    }

    fn start_turn(&mut self, now_ms: u64) -> Vec<Action> {
        self.turn += 1;
        self.stats.turns += 1;
        self.turn_start_ms = now_ms;
        self.tried.clear();
        self.passing = None;
        let to = self.peers();
        let Some(token) = self.newest.clone() else {
            self.phase = Phase::Idle;
            return Vec::new();
        };
        if to.is_empty() {
            // Alone: nobody to tell, nobody to probe.
            self.phase = Phase::Resting;
            return Vec::new();
        }
        self.phase = Phase::Notifying;
        vec![Action::Notify {
            turn: self.turn,
            token,
            to,
        }]
    }

    /// Records `t` if it is newer than anything seen; a holder of an older token drops it.
    fn observe(&mut self, t: &Token, now_ms: u64) -> Vec<Action> {
        if self.newest.as_ref().is_some_and(|n| !t.newer_than(n)) {
            return Vec::new();
        }
        self.newest = Some(t.clone());
        self.evidence_ms = now_ms;
        if self.phase == Phase::Idle || t.holder == self.me {
            return Vec::new();
        }
        if let Some(p) = self.passing.take() {
            if (p.generation, &p.origin) == (t.generation, &t.origin) && t.seq >= p.seq {
                // The receiver's notice overtook the answer to our pass: it was accepted.
                self.stats.passes += 1;
                self.phase = Phase::Idle;
                return Vec::new();
            }
        }
        let aborted = self.phase == Phase::Probing;
        self.phase = Phase::Idle;
        self.passing = None;
        self.stats.dropped += 1;
        if aborted {
            vec![Action::Abort { turn: self.turn }]
        } else {
            Vec::new()
        }
    }

    /// A peer passes `token` (its holder must be this member). Returns whether it was
    /// accepted, the newest token this member now knows (the answer), and what to do.
    pub fn on_pass(&mut self, token: &Token, now_ms: u64) -> (bool, Option<Token>, Vec<Action>) {
        if self.holding() && self.newest.as_ref() == Some(token) {
            // The same pass again (its answer was lost and the sender retried): accepted once.
            return (true, self.newest.clone(), Vec::new());
        }
        let newer = self.newest.as_ref().is_none_or(|n| token.newer_than(n));
        if token.holder != self.me || !newer {
            self.stats.dropped += 1;
            return (false, self.newest.clone(), Vec::new());
        }
        let mut actions = Vec::new();
        if self.phase != Phase::Idle {
            // We held an older token: it is a duplicate; the newer one takes over.
            self.stats.dropped += 1;
            if self.phase == Phase::Probing {
                actions.push(Action::Abort { turn: self.turn });
            }
        }
        self.newest = Some(token.clone());
        self.evidence_ms = now_ms;
        actions.extend(self.start_turn(now_ms));
        (true, self.newest.clone(), actions)
    }

    /// A holder announces `token`. Returns the newest token this member now knows (the
    /// answer) and what to do.
    pub fn on_notice(&mut self, token: &Token, now_ms: u64) -> (Option<Token>, Vec<Action>) {
        let actions = self.observe(token, now_ms);
        (self.newest.clone(), actions)
    }

    /// The answers to the notices of `turn` (`None`: no answer, or an answer without a token).
    pub fn notices_done(&mut self, turn: u64, answers: &[Option<Token>], now_ms: u64) -> Vec<Action> {
        if turn != self.turn || self.phase != Phase::Notifying {
            return Vec::new();
        }
        for t in answers.iter().flatten() {
            self.observe(t, now_ms);
        }
        if self.phase != Phase::Notifying {
            return Vec::new();
        }
        let targets = self.choose_targets();
        let Some(token) = self.newest.clone().filter(|_| !targets.is_empty()) else {
            self.phase = Phase::Resting;
            return Vec::new();
        };
        self.phase = Phase::Probing;
        vec![Action::Probe {
            turn: self.turn,
            token,
            targets,
        }]
    }

    fn choose_targets(&mut self) -> Vec<String> {
        let after = self.cursor.clone().unwrap_or_else(|| self.me.clone());
        let targets: Vec<String> = self
            .ring_after(&after)
            .into_iter()
            .take(self.s.peers_per_turn.max(1))
            .collect();
        if let Some(last) = targets.last() {
            self.cursor = Some(last.clone());
        }
        targets
    }

    /// The probes of `turn` are over (done, failed or aborted).
    pub fn probe_done(&mut self, turn: u64) {
        if turn == self.turn && self.phase == Phase::Probing {
            self.phase = Phase::Resting;
        }
    }

    /// Passes to the next member not yet tried in this turn; keeps the token for another turn
    /// when there is none.
    fn next_pass(&mut self, now_ms: u64) -> Vec<Action> {
        let Some(held) = self.newest.clone() else {
            self.phase = Phase::Idle;
            return Vec::new();
        };
        let next = self
            .ring_after(&self.me)
            .into_iter()
            .find(|m| !self.tried.contains(m));
        match next {
            Some(to) => {
                let token = Token {
                    seq: held.seq + 1,
                    holder: to.clone(),
                    ..held
                };
                self.phase = Phase::Passing;
                self.passing = Some(token.clone());
                vec![Action::Pass {
                    turn: self.turn,
                    to,
                    token,
                }]
            }
            None => {
                // Nobody takes it: another turn of our own, under a new seq so the notices are
                // evidence for everyone.
                self.newest = Some(Token {
                    seq: held.seq + 1,
                    ..held
                });
                self.evidence_ms = now_ms;
                self.start_turn(now_ms)
            }
        }
    }

    /// The outcome of the pass of `turn` to `to`.
    pub fn pass_result(&mut self, turn: u64, to: &str, outcome: PassOutcome, now_ms: u64) -> Vec<Action> {
        if turn != self.turn || self.phase != Phase::Passing {
            return Vec::new();
        }
        let Some(passed) = self.passing.clone().filter(|t| t.holder == to) else {
            return Vec::new();
        };
        match outcome {
            PassOutcome::Accepted => {
                self.stats.passes += 1;
                self.passing = None;
                self.phase = Phase::Idle;
                self.newest = Some(passed);
                self.evidence_ms = now_ms;
                Vec::new()
            }
            PassOutcome::Rejected(newest) => {
                // The receiver knows a newer token: ours is a duplicate.
                self.passing = None;
                if let Some(t) = newest {
                    self.observe(&t, now_ms);
                }
                if self.phase != Phase::Idle {
                    self.phase = Phase::Idle;
                    self.stats.dropped += 1;
                }
                Vec::new()
            }
            PassOutcome::Failed => {
                self.stats.pass_failures += 1;
                self.tried.insert(to.to_string());
                self.passing = None;
                self.next_pass(now_ms)
            }
        }
    }

    /// Leaving the clique (shutdown): the pass to make now so the token is not lost, if this
    /// member is resting or probing with it. The caller reports it with `pass_result`.
    pub fn leave(&mut self, now_ms: u64) -> Vec<Action> {
        match self.phase {
            Phase::Probing | Phase::Resting | Phase::Notifying => {
                let mut actions = Vec::new();
                if self.phase == Phase::Probing {
                    actions.push(Action::Abort { turn: self.turn });
                }
                self.tried.clear();
                let pass = self.next_pass(now_ms);
                // Alone: next_pass started another turn of our own; nobody to leave it to.
                actions.extend(pass.into_iter().filter(|a| matches!(a, Action::Pass { .. })));
                actions
            }
            _ => Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests;
