//! The reservation book of one federation endpoint: the hosts it manages, each with a
//! reservation calendar ([`gma_broker::calendar::Calendar`], the simulated resource manager's
//! own), and the reservations it granted, by number. Pure: no I/O, no clock (every call takes
//! the time), so the property tests drive it from many threads at once.
//!
//! A request asks for `cpus` of one host over `[start_s, end_s)`; an exclusive one asks for all
//! of the host's CPUs. The calendar grants it only if, at every instant of the interval, the
//! CPUs of the reservations held there plus the request stay within the host's CPUs: so an
//! exclusive reservation overlaps no other one, and two exclusive requests for the same host and
//! time are never both granted. A request that starts now must also find the CPUs free now (the
//! live view, with the CPUs of reservations not yet started taken off).

use std::collections::BTreeMap;

use gma_broker::calendar::Calendar;
use gma_broker::reserve::{Answer, ReserveRequest};
use gma_broker::Job;

/// Most reservations one endpoint holds at once.
pub const MAX_RESERVATIONS: usize = 10_000;

/// The state of a reservation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Reserved,
    /// Its job was submitted (`job_id` names it once known).
    Started,
}

impl State {
    pub fn as_str(self) -> &'static str {
        match self {
            State::Reserved => "reserved",
            State::Started => "started",
        }
    }
}

/// A granted reservation.
#[derive(Debug, Clone, PartialEq)]
pub struct Rec {
    pub number: u64,
    pub host: String,
    pub cpus: u32,
    pub start_s: i64,
    pub end_s: i64,
    pub exclusive: bool,
    pub owner: String,
    pub state: State,
    pub job: Job,
    pub job_id: String,
}

/// What a request asks for.
#[derive(Debug, Clone, PartialEq)]
pub struct Ask {
    pub host: String,
    /// The host's CPUs (its calendar's capacity).
    pub capacity: u32,
    /// CPUs free on the host now (the live view), when known.
    pub free_now: Option<u32>,
    pub job: Job,
    pub exclusive: bool,
    pub start_s: i64,
    pub duration_s: i64,
    pub owner: String,
}

/// Why a request or a step was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// Never possible as asked (more CPUs than the host has, a bad window).
    Never(String),
    /// Held by other reservations (or busy now) over that time; `free_from` when a later start
    /// would be granted.
    Busy { reason: String, free_from: Option<i64> },
    /// No such reservation.
    Unknown(u64),
    /// Not the holder.
    NotOwner(String),
    /// Not in a state (or window) for this step.
    State(String),
    /// The book is full.
    Full,
}

/// The reservations of one endpoint.
#[derive(Debug, Default)]
pub struct Book {
    calendars: BTreeMap<String, Calendar>,
    recs: BTreeMap<u64, Rec>,
    next: u64,
}

impl Book {
    pub fn new() -> Book {
        Book::default()
    }

    /// Forgets the reservations that ended by `now_s` (their calendar blocks too).
    pub fn expire(&mut self, now_s: i64) {
        let ended: Vec<u64> = self
            .recs
            .values()
            .filter(|r| r.end_s <= now_s)
            .map(|r| r.number)
            .collect();
        for n in ended {
            self.drop_rec(n);
        }
    }

    fn drop_rec(&mut self, n: u64) -> Option<Rec> {
        let r = self.recs.remove(&n)?;
        if let Some(c) = self.calendars.get_mut(&r.host) {
            let _ = c.release(&n.to_string());
        }
        Some(r)
    }

    /// CPUs of `host` held at `now_s` by reservations whose job has not started: the live view
    /// shows them free, but they are promised.
    pub fn withheld(&self, host: &str, now_s: i64) -> u32 {
        self.recs
            .values()
            .filter(|r| r.host == host && r.state == State::Reserved && r.start_s <= now_s && now_s < r.end_s)
            .map(|r| r.cpus)
            .sum()
    }

    /// Every host with CPUs withheld at `now_s`, and how many.
    pub fn withheld_all(&self, now_s: i64) -> BTreeMap<String, u32> {
        let mut out = BTreeMap::new();
        for r in self.recs.values() {
            if r.state == State::Reserved && r.start_s <= now_s && now_s < r.end_s {
                *out.entry(r.host.clone()).or_insert(0) += r.cpus;
            }
        }
        out
    }

    /// Grants `ask` or says why not.
    pub fn reserve(&mut self, ask: Ask, now_s: i64) -> Result<Rec, Refusal> {
        self.expire(now_s);
        if self.recs.len() >= MAX_RESERVATIONS {
            return Err(Refusal::Full);
        }
        if ask.capacity == 0 {
            return Err(Refusal::Never(format!("host {:?} has no CPUs", ask.host)));
        }
        let cpus = if ask.exclusive { ask.capacity } else { ask.job.cpus };
        if cpus > ask.capacity {
            return Err(Refusal::Never(format!(
                "{cpus} CPUs asked, host {:?} has {}",
                ask.host, ask.capacity
            )));
        }
        if ask.duration_s <= 0 {
            return Err(Refusal::Never(format!(
                "duration {} s: give at least 1 s",
                ask.duration_s
            )));
        }
        let start_s = ask.start_s.max(now_s);
        let end_s = start_s.saturating_add(ask.duration_s);
        if start_s <= now_s {
            if let Some(free) = ask.free_now {
                let promised = self.withheld(&ask.host, now_s);
                let avail = free.saturating_sub(promised);
                if avail < cpus {
                    return Err(Refusal::Busy {
                        reason: format!(
                            "host {:?} has {avail} CPUs free now ({free} free, {promised} reserved), {cpus} asked{}",
                            ask.host,
                            if ask.exclusive { " (exclusive: all of them)" } else { "" }
                        ),
                        free_from: None,
                    });
                }
            }
        }
        let cal = self
            .calendars
            .entry(ask.host.clone())
            .or_insert_with(|| Calendar::new(ask.host.clone(), ask.capacity));
        // The window is the one start asked for: a reservation is for that time or not at all.
        let req = ReserveRequest {
            resource: ask.host.clone(),
            cpus,
            duration_s: end_s - start_s,
            earliest_s: start_s,
            latest_s: start_s,
            flexible: false,
            owner: ask.owner.clone(),
        };
        let number = self.next + 1;
        match cal.reserve(&req, &number.to_string()) {
            Answer::Granted(_) => {
                self.next = number;
                let rec = Rec {
                    number,
                    host: ask.host,
                    cpus,
                    start_s,
                    end_s,
                    exclusive: ask.exclusive,
                    owner: ask.owner,
                    state: State::Reserved,
                    job: ask.job,
                    job_id: String::new(),
                };
                self.recs.insert(number, rec.clone());
                Ok(rec)
            }
            Answer::Never(why) => Err(Refusal::Never(why)),
            Answer::Retry { from_s, .. } => {
                Err(Refusal::Busy {
                    reason: format!(
                    "host {:?} is reserved over [{start_s}, {end_s}){}: free for this request from {from_s}",
                    ask.host,
                    if ask.exclusive { " (an exclusive request needs all its CPUs)" } else { "" }
                ),
                    free_from: Some(from_s),
                })
            }
        }
    }

    fn held(&self, number: u64, owner: &str) -> Result<&Rec, Refusal> {
        let r = self.recs.get(&number).ok_or(Refusal::Unknown(number))?;
        if r.owner != owner {
            return Err(Refusal::NotOwner(format!(
                "reservation {number} is held by {:?}, not {owner:?}",
                r.owner
            )));
        }
        Ok(r)
    }

    /// Marks reservation `number` started (once): its job may now be submitted.
    pub fn begin(&mut self, number: u64, owner: &str, now_s: i64) -> Result<Rec, Refusal> {
        self.expire(now_s);
        let r = self.held(number, owner)?;
        if r.state != State::Reserved {
            return Err(Refusal::State(format!(
                "reservation {number} has already started (job {:?})",
                r.job_id
            )));
        }
        if now_s < r.start_s {
            return Err(Refusal::State(format!(
                "reservation {number} starts at {} (in {} s): start it then",
                r.start_s,
                r.start_s - now_s
            )));
        }
        let r = self.recs.get_mut(&number).ok_or(Refusal::Unknown(number))?;
        r.state = State::Started;
        Ok(r.clone())
    }

    /// Records the job started on reservation `number`.
    pub fn started(&mut self, number: u64, job_id: &str) -> Option<Rec> {
        let r = self.recs.get_mut(&number)?;
        r.job_id = job_id.to_string();
        Some(r.clone())
    }

    /// Undoes [`Book::begin`] when the job could not be submitted.
    pub fn unbegin(&mut self, number: u64) {
        if let Some(r) = self.recs.get_mut(&number) {
            if r.job_id.is_empty() {
                r.state = State::Reserved;
            }
        }
    }

    /// Releases reservation `number` (its calendar block is free again).
    pub fn release(&mut self, number: u64, owner: &str, now_s: i64) -> Result<Rec, Refusal> {
        self.expire(now_s);
        self.held(number, owner)?;
        self.drop_rec(number).ok_or(Refusal::Unknown(number))
    }

    /// The reservations held, by number.
    pub fn list(&self) -> Vec<Rec> {
        self.recs.values().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use parking_lot::Mutex;
    use proptest::prelude::*;

    use super::*;

    fn job(cpus: u32) -> Job {
        Job {
            name: "j".into(),
            cpus,
            reference_time_s: 60.0,
            ..Job::default()
        }
    }

    fn ask(host: &str, cpus: u32, exclusive: bool, start_s: i64, duration_s: i64, owner: &str) -> Ask {
        Ask {
            host: host.into(),
            capacity: 4,
            free_now: None,
            job: job(cpus),
            exclusive,
            start_s,
            duration_s,
            owner: owner.into(),
        }
    }

    #[test]
    fn an_exclusive_reservation_is_granted_once_and_again_after_release() {
        let mut b = Book::new();
        let r = b.reserve(ask("h", 1, true, 100, 50, "alice"), 0).unwrap();
        assert_eq!((r.number, r.cpus, r.start_s, r.end_s), (1, 4, 100, 150));
        // Same host, overlapping time: refused, with the time it would be free.
        let e = b.reserve(ask("h", 1, true, 120, 10, "bob"), 0).unwrap_err();
        assert!(
            matches!(
                e,
                Refusal::Busy {
                    free_from: Some(150),
                    ..
                }
            ),
            "{e:?}"
        );
        // A shared request over the exclusive one is refused too; another host or time is not.
        assert!(b.reserve(ask("h", 1, false, 149, 10, "bob"), 0).is_err());
        assert_eq!(
            b.reserve(ask("h", 4, false, 150, 10, "bob"), 0).unwrap().number,
            2
        );
        assert_eq!(b.reserve(ask("g", 1, true, 100, 50, "bob"), 0).unwrap().number, 3);
        // Only the holder releases; then the time is free.
        assert!(matches!(b.release(1, "bob", 0), Err(Refusal::NotOwner(_))));
        b.release(1, "alice", 0).unwrap();
        assert!(matches!(b.release(1, "alice", 0), Err(Refusal::Unknown(1))));
        assert_eq!(b.reserve(ask("h", 1, true, 120, 10, "bob"), 0).unwrap().number, 4);
    }

    #[test]
    fn now_needs_the_cpus_free_now_and_start_is_once_and_in_time() {
        let mut b = Book::new();
        let mut a = ask("h", 2, false, 0, 60, "alice");
        a.free_now = Some(1);
        assert!(matches!(
            b.reserve(a.clone(), 1000),
            Err(Refusal::Busy { free_from: None, .. })
        ));
        a.free_now = Some(4);
        let r = b.reserve(a.clone(), 1000).unwrap();
        assert_eq!((r.start_s, r.end_s), (1000, 1060));
        assert_eq!(b.withheld("h", 1000), 2);
        // 4 free in the view, 2 promised: an exclusive request now is refused.
        let mut x = ask("h", 1, true, 0, 10, "bob");
        x.free_now = Some(4);
        assert!(b.reserve(x, 1001).is_err());
        // Starting: once, by the holder; a started reservation is no longer withheld.
        assert!(matches!(b.begin(1, "bob", 1001), Err(Refusal::NotOwner(_))));
        b.begin(1, "alice", 1001).unwrap();
        assert!(matches!(b.begin(1, "alice", 1001), Err(Refusal::State(_))));
        b.started(1, "S/x");
        assert_eq!(b.withheld("h", 1001), 0);
        // A future one cannot start early; ended ones are forgotten.
        let f = b.reserve(ask("h", 1, false, 2000, 10, "alice"), 1001).unwrap();
        assert!(matches!(b.begin(f.number, "alice", 1500), Err(Refusal::State(_))));
        b.expire(3000);
        assert!(b.list().is_empty());
        // Bad shapes are never possible.
        assert!(matches!(
            b.reserve(ask("h", 5, false, 0, 10, "a"), 0),
            Err(Refusal::Never(_))
        ));
        assert!(matches!(
            b.reserve(ask("h", 1, false, 0, 0, "a"), 0),
            Err(Refusal::Never(_))
        ));
    }

    /// One request of a requester: host, CPUs, exclusive, start, duration.
    fn arb_req() -> impl Strategy<Value = (u8, u32, bool, i64, i64)> {
        (0u8..2, 1u32..=4, any::<bool>(), 0i64..30, 1i64..15)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        /// Requesters on threads of their own race for the same hosts and times: whatever
        /// the interleaving, the reservations granted (as the requesters saw them) never hold
        /// more CPUs than a host has at any instant, and an exclusive one overlaps no other
        /// grant on its host.
        #[test]
        fn concurrent_requesters_never_get_an_exclusive_resource_twice(
            plans in proptest::collection::vec(proptest::collection::vec(arb_req(), 1..12), 2..6)
        ) {
            let book = Arc::new(Mutex::new(Book::new()));
            let barrier = Arc::new(std::sync::Barrier::new(plans.len()));
            let threads: Vec<_> = plans.into_iter().enumerate().map(|(i, plan)| {
                let book = book.clone();
                let barrier = barrier.clone();
                std::thread::spawn(move || {
                    barrier.wait();
                    let mut got = Vec::new();
                    for (h, cpus, excl, start, dur) in plan {
                        let host = format!("h{h}");
                        let a = ask(&host, cpus, excl, start, dur, &format!("r{i}"));
                        if let Ok(r) = book.lock().reserve(a, 0) {
                            got.push(r);
                        }
                        std::thread::yield_now();
                    }
                    got
                })
            }).collect();
            let granted: Vec<Rec> = threads.into_iter().flat_map(|t| t.join().unwrap()).collect();
            let mut numbers: Vec<u64> = granted.iter().map(|r| r.number).collect();
            numbers.sort_unstable();
            numbers.dedup();
            prop_assert_eq!(numbers.len(), granted.len(), "a number was handed out twice");
            for r in &granted {
                for t in r.start_s..r.end_s {
                    let load: u32 = granted
                        .iter()
                        .filter(|o| o.host == r.host && o.start_s <= t && t < o.end_s)
                        .map(|o| o.cpus)
                        .sum();
                    prop_assert!(load <= 4, "{} holds {} CPUs at {}", r.host, load, t);
                }
                if r.exclusive {
                    for o in &granted {
                        let overlap = o.number != r.number && o.host == r.host
                            && o.start_s < r.end_s && r.start_s < o.end_s;
                        prop_assert!(!overlap, "exclusive {:?} overlaps {:?}", r, o);
                    }
                }
            }
            // The book agrees with what the requesters were told.
            prop_assert_eq!(book.lock().list().len(), granted.len());
        }
    }
}
