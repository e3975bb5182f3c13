//! Per-resource reservation calendars: the state of a simulated resource manager, and the
//! in-memory [`Reserver`] that tests and replays run the coallocator against.
//!
//! A calendar knows its capacity (CPUs) and the reservations it has granted, each a block of
//! `cpus` over `[start_s, end_s)`. A request fits at start `t` iff at every instant of
//! `[t, t + duration)` the CPUs of the overlapping reservations plus the request stay within
//! capacity. Answers follow the three-way protocol of [`crate::reserve`]: granted at the
//! earliest feasible start in the window, never (with the reason), or retry from the earliest
//! feasible start after the window.

use std::collections::BTreeMap;

use parking_lot::Mutex;

use crate::reserve::{Answer, ModifyAnswer, Reservation, ReserveError, ReserveRequest, Reserver};

/// One granted block in a calendar.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    id: String,
    owner: String,
    cpus: u32,
    start_s: i64,
    end_s: i64,
}

/// The reservation calendar of one resource.
#[derive(Debug, Clone)]
pub struct Calendar {
    name: String,
    cpus: u32,
    horizon_end_s: Option<i64>,
    /// When set, a modify is release + create (as Maui's): a refused modify loses the original.
    non_atomic: bool,
    entries: Vec<Entry>,
}

impl Calendar {
    /// An empty calendar of `cpus` CPUs with no horizon and atomic modifies.
    pub fn new(name: impl Into<String>, cpus: u32) -> Self {
        Calendar {
            name: name.into(),
            cpus,
            horizon_end_s: None,
            non_atomic: false,
            entries: Vec::new(),
        }
    }

    /// Reservations must end at or before `end_s` (the end of the manager's planning horizon).
    pub fn with_horizon(mut self, end_s: i64) -> Self {
        self.horizon_end_s = Some(end_s);
        self
    }

    /// Emulates a manager (Maui) whose modify is release then create.
    pub fn with_non_atomic_modify(mut self, non_atomic: bool) -> Self {
        self.non_atomic = non_atomic;
        self
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn cpus(&self) -> u32 {
        self.cpus
    }

    pub fn horizon_end_s(&self) -> Option<i64> {
        self.horizon_end_s
    }

    pub fn non_atomic(&self) -> bool {
        self.non_atomic
    }

    /// Whether `id` is held here.
    pub fn holds(&self, id: &str) -> bool {
        self.entries.iter().any(|e| e.id == id)
    }

    fn reservation(&self, e: &Entry) -> Reservation {
        Reservation {
            id: e.id.clone(),
            resource: self.name.clone(),
            cpus: e.cpus,
            start_s: e.start_s,
            end_s: e.end_s,
            owner: e.owner.clone(),
        }
    }

    /// CPUs in use at instant `t` (blocks are half-open), not counting `ignore`.
    fn load_at(&self, t: i64, ignore: Option<&str>) -> u64 {
        self.entries
            .iter()
            .filter(|e| Some(e.id.as_str()) != ignore && e.start_s <= t && t < e.end_s)
            .map(|e| u64::from(e.cpus))
            .sum()
    }

    /// Whether `cpus` fit over `[start, end)`. The load only rises at block starts, so checking
    /// `start` and every block start inside the interval covers every instant.
    fn fits(&self, cpus: u32, start: i64, end: i64, ignore: Option<&str>) -> bool {
        let room = u64::from(self.cpus);
        let need = u64::from(cpus);
        if self.load_at(start, ignore) + need > room {
            return false;
        }
        self.entries
            .iter()
            .filter(|e| Some(e.id.as_str()) != ignore && e.start_s > start && e.start_s < end)
            .all(|e| self.load_at(e.start_s, ignore) + need <= room)
    }

    /// The highest load over all time (for invariant checks in tests and replays).
    pub fn peak_load(&self) -> u64 {
        self.entries
            .iter()
            .map(|e| self.load_at(e.start_s, None))
            .max()
            .unwrap_or(0)
    }

    /// The answer to `req` on this calendar, ignoring reservation `ignore` (a modify is
    /// evaluated as if the reservation being reshaped were not there). Returns the granted
    /// start rather than a reservation so callers choose the id.
    fn evaluate(&self, req: &ReserveRequest, ignore: Option<&str>) -> Result<i64, Answer> {
        let never = |why: String| Err(Answer::Never(why));
        if req.cpus == 0 {
            return never("zero cpus requested".to_string());
        }
        if req.cpus > self.cpus {
            return never(format!(
                "{} cpus requested, {:?} has {}",
                req.cpus, self.name, self.cpus
            ));
        }
        if req.duration_s <= 0 {
            return never(format!("non-positive duration {} s", req.duration_s));
        }
        if req.earliest_s > req.latest_s {
            return never(format!(
                "empty start window [{}, {}]",
                req.earliest_s, req.latest_s
            ));
        }
        let ends_by_horizon = |t: i64| {
            self.horizon_end_s
                .is_none_or(|h| t.saturating_add(req.duration_s) <= h)
        };
        if !ends_by_horizon(req.earliest_s) {
            return never(format!(
                "a {} s job starting at {} cannot end by the horizon {:?}",
                req.duration_s, req.earliest_s, self.horizon_end_s
            ));
        }
        // The earliest feasible start is `earliest` itself or the end of some block: the set of
        // infeasible starts is a union of intervals whose right ends are block ends.
        let mut candidates: Vec<i64> = std::iter::once(req.earliest_s)
            .chain(
                self.entries
                    .iter()
                    .filter(|e| Some(e.id.as_str()) != ignore && e.end_s > req.earliest_s)
                    .map(|e| e.end_s),
            )
            .collect();
        candidates.sort_unstable();
        candidates.dedup();
        for t in candidates {
            if !ends_by_horizon(t) {
                break;
            }
            if self.fits(req.cpus, t, t.saturating_add(req.duration_s), ignore) {
                if t <= req.latest_s {
                    return Ok(t);
                }
                return Err(Answer::Retry {
                    from_s: t,
                    reason: format!(
                        "{:?} is busy over the window [{}, {}]; free from {}",
                        self.name, req.earliest_s, req.latest_s, t
                    ),
                });
            }
        }
        never(format!(
            "no room on {:?} before the horizon {:?}",
            self.name, self.horizon_end_s
        ))
    }

    /// Creates a reservation with id `id` at the earliest feasible start in the window.
    pub fn reserve(&mut self, req: &ReserveRequest, id: &str) -> Answer {
        match self.evaluate(req, None) {
            Ok(start_s) => {
                let e = Entry {
                    id: id.to_string(),
                    owner: req.owner.clone(),
                    cpus: req.cpus,
                    start_s,
                    end_s: start_s.saturating_add(req.duration_s),
                };
                let r = self.reservation(&e);
                self.entries.push(e);
                Answer::Granted(r)
            }
            Err(answer) => answer,
        }
    }

    /// Reshapes reservation `id` to `req` (same id). Atomic unless the calendar emulates
    /// Maui: then the original is released first and is gone if the new shape is refused.
    pub fn modify(&mut self, id: &str, req: &ReserveRequest) -> Result<ModifyAnswer, ReserveError> {
        let Some(pos) = self.entries.iter().position(|e| e.id == id) else {
            return Err(ReserveError::NotFound { id: id.to_string() });
        };
        let owner = self.entries[pos].owner.clone();
        if self.non_atomic {
            self.entries.remove(pos);
            return Ok(match self.evaluate(req, None) {
                Ok(start_s) => {
                    let e = Entry {
                        id: id.to_string(),
                        owner,
                        cpus: req.cpus,
                        start_s,
                        end_s: start_s.saturating_add(req.duration_s),
                    };
                    let r = self.reservation(&e);
                    self.entries.push(e);
                    ModifyAnswer {
                        answer: Answer::Granted(r),
                        original_released: false,
                    }
                }
                Err(answer) => ModifyAnswer {
                    answer,
                    original_released: true,
                },
            });
        }
        Ok(match self.evaluate(req, Some(id)) {
            Ok(start_s) => {
                let e = &mut self.entries[pos];
                e.cpus = req.cpus;
                e.start_s = start_s;
                e.end_s = start_s.saturating_add(req.duration_s);
                let r = self.reservation(&self.entries[pos]);
                ModifyAnswer {
                    answer: Answer::Granted(r),
                    original_released: false,
                }
            }
            Err(answer) => ModifyAnswer {
                answer,
                original_released: false,
            },
        })
    }

    /// Releases reservation `id`.
    pub fn release(&mut self, id: &str) -> Result<Reservation, ReserveError> {
        let Some(pos) = self.entries.iter().position(|e| e.id == id) else {
            return Err(ReserveError::NotFound { id: id.to_string() });
        };
        let e = self.entries.remove(pos);
        Ok(self.reservation(&e))
    }

    /// Reservations held by `owner` ("" = anyone), by start time.
    pub fn list(&self, owner: &str) -> Vec<Reservation> {
        let mut out: Vec<Reservation> = self
            .entries
            .iter()
            .filter(|e| owner.is_empty() || e.owner == owner)
            .map(|e| self.reservation(e))
            .collect();
        out.sort_by(|a, b| (a.start_s, &a.id).cmp(&(b.start_s, &b.id)));
        out
    }

    fn get(&self, id: &str) -> Option<&Entry> {
        self.entries.iter().find(|e| e.id == id)
    }
}

/// How many operations a [`Calendars`] set has been asked to perform (refused ones included).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OpCounts {
    pub creates: u64,
    pub modifies: u64,
    pub releases: u64,
}

/// A set of calendars by resource name, handing out ids unique across the set.
#[derive(Debug, Clone, Default)]
pub struct Calendars {
    calendars: BTreeMap<String, Calendar>,
    next_id: u64,
    counts: OpCounts,
}

impl Calendars {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds (or replaces) a calendar under its name.
    pub fn insert(&mut self, c: Calendar) {
        self.calendars.insert(c.name.clone(), c);
    }

    pub fn get(&self, name: &str) -> Option<&Calendar> {
        self.calendars.get(name)
    }

    pub fn get_mut(&mut self, name: &str) -> Option<&mut Calendar> {
        self.calendars.get_mut(name)
    }

    pub fn iter(&self) -> impl Iterator<Item = &Calendar> {
        self.calendars.values()
    }

    pub fn counts(&self) -> OpCounts {
        self.counts
    }

    fn fresh_id(&mut self) -> String {
        self.next_id += 1;
        format!("ar-{}", self.next_id)
    }

    fn owner_of(&mut self, id: &str) -> Option<&mut Calendar> {
        self.calendars.values_mut().find(|c| c.holds(id))
    }

    pub fn reserve(&mut self, req: &ReserveRequest) -> Answer {
        self.counts.creates += 1;
        if !self.calendars.contains_key(&req.resource) {
            return Answer::Never(format!("unknown resource {:?}", req.resource));
        }
        let id = self.fresh_id();
        match self.calendars.get_mut(&req.resource) {
            Some(c) => c.reserve(req, &id),
            None => Answer::Never(format!("unknown resource {:?}", req.resource)),
        }
    }

    /// Reshapes `id`; the request must name the resource holding it (or none) and come from
    /// the holder.
    pub fn modify(&mut self, id: &str, req: &ReserveRequest) -> Result<ModifyAnswer, ReserveError> {
        self.counts.modifies += 1;
        let Some(c) = self.owner_of(id) else {
            return Err(ReserveError::NotFound { id: id.to_string() });
        };
        if !req.resource.is_empty() && req.resource != c.name {
            return Err(ReserveError::Invalid(format!(
                "reservation {id:?} is on {:?}, not {:?} (a modify keeps the resource)",
                c.name, req.resource
            )));
        }
        if let Some(e) = c.get(id) {
            if e.owner != req.owner {
                return Err(ReserveError::Invalid(format!(
                    "reservation {id:?} is held by {:?}, not {:?}",
                    e.owner, req.owner
                )));
            }
        }
        c.modify(id, req)
    }

    /// Releases `id` on behalf of `owner` (who must be its holder).
    pub fn release(&mut self, id: &str, owner: &str) -> Result<Reservation, ReserveError> {
        self.counts.releases += 1;
        let Some(c) = self.owner_of(id) else {
            return Err(ReserveError::NotFound { id: id.to_string() });
        };
        if let Some(e) = c.get(id) {
            if e.owner != owner {
                return Err(ReserveError::Invalid(format!(
                    "reservation {id:?} is held by {:?}, not {owner:?}",
                    e.owner
                )));
            }
        }
        c.release(id)
    }

    /// Reservations on `resource` ("" = all) held by `owner` ("" = anyone).
    pub fn list(&self, resource: &str, owner: &str) -> Vec<Reservation> {
        self.calendars
            .values()
            .filter(|c| resource.is_empty() || c.name == resource)
            .flat_map(|c| c.list(owner))
            .collect()
    }
}

/// The in-memory resource manager: [`Calendars`] behind a lock, speaking [`Reserver`].
#[derive(Debug, Default)]
pub struct MemoryReserver {
    inner: Mutex<Calendars>,
}

impl MemoryReserver {
    pub fn new(calendars: Calendars) -> Self {
        MemoryReserver {
            inner: Mutex::new(calendars),
        }
    }

    /// Resources of the given names and capacities (no horizon, atomic modifies).
    pub fn with_resources<'a>(resources: impl IntoIterator<Item = (&'a str, u32)>) -> Self {
        let mut cals = Calendars::new();
        for (name, cpus) in resources {
            cals.insert(Calendar::new(name, cpus));
        }
        Self::new(cals)
    }

    pub fn counts(&self) -> OpCounts {
        self.inner.lock().counts()
    }

    /// Runs `f` over the calendars (setup and invariant checks).
    pub fn with<T>(&self, f: impl FnOnce(&mut Calendars) -> T) -> T {
        f(&mut self.inner.lock())
    }

    /// The highest load relative to capacity across calendars: `false` if any is over.
    pub fn within_capacity(&self) -> bool {
        self.inner
            .lock()
            .iter()
            .all(|c| c.peak_load() <= u64::from(c.cpus()))
    }
}

impl Reserver for MemoryReserver {
    async fn reserve(&self, req: &ReserveRequest) -> Result<Answer, ReserveError> {
        Ok(self.inner.lock().reserve(req))
    }

    async fn modify(&self, id: &str, req: &ReserveRequest) -> Result<ModifyAnswer, ReserveError> {
        self.inner.lock().modify(id, req)
    }

    async fn release(&self, id: &str, owner: &str) -> Result<(), ReserveError> {
        self.inner.lock().release(id, owner).map(|_| ())
    }

    async fn list(&self, resource: &str, owner: &str) -> Result<Vec<Reservation>, ReserveError> {
        Ok(self.inner.lock().list(resource, owner))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(resource: &str, cpus: u32, duration_s: i64, earliest_s: i64, latest_s: i64) -> ReserveRequest {
        ReserveRequest {
            resource: resource.to_string(),
            cpus,
            duration_s,
            earliest_s,
            latest_s,
            flexible: false,
            owner: "me".to_string(),
        }
    }

    fn granted(a: &Answer) -> Reservation {
        match a {
            Answer::Granted(r) => r.clone(),
            other => panic!("expected granted, got {other:?}"),
        }
    }

    #[test]
    fn capacity_above_one_lets_blocks_overlap() {
        let mut c = Calendar::new("r", 2);
        let a = granted(&c.reserve(&req("r", 1, 100, 0, 0), "a"));
        let b = granted(&c.reserve(&req("r", 1, 100, 0, 0), "b"));
        assert_eq!((a.start_s, b.start_s), (0, 0));
        // The third would need a third CPU over [0, 100): the earliest it can start is 100.
        assert!(matches!(
            c.reserve(&req("r", 1, 100, 0, 50), "c"),
            Answer::Retry { from_s: 100, .. }
        ));
        // Two CPUs from 50 do not fit either (the blocks run to 100); from 100 they do.
        assert!(matches!(
            c.reserve(&req("r", 2, 10, 50, 60), "d"),
            Answer::Retry { from_s: 100, .. }
        ));
        assert_eq!(c.peak_load(), 2);
    }

    #[test]
    fn the_earliest_start_in_the_window_is_chosen() {
        let mut c = Calendar::new("r", 1);
        granted(&c.reserve(&req("r", 1, 10, 20, 20), "x")); // [20, 30)
        granted(&c.reserve(&req("r", 1, 10, 40, 40), "y")); // [40, 50)
                                                            // A 10 s job fits before 20 when it starts at 5..=10; a 15 s job only from 50.
        assert_eq!(granted(&c.reserve(&req("r", 1, 10, 5, 100), "a")).start_s, 5);
        assert_eq!(granted(&c.reserve(&req("r", 1, 10, 8, 100), "b")).start_s, 30);
        assert_eq!(granted(&c.reserve(&req("r", 1, 15, 0, 100), "c")).start_s, 50);
        assert_eq!(c.peak_load(), 1);
    }

    #[test]
    fn retry_names_the_earliest_later_start() {
        let mut c = Calendar::new("r", 1);
        granted(&c.reserve(&req("r", 1, 10, 10, 10), "x")); // [10, 20)
        granted(&c.reserve(&req("r", 1, 5, 25, 25), "y")); // [25, 30)
                                                           // 10 s from [5, 15]: [20, 30) collides with y, so the first fit is 30.
        match c.reserve(&req("r", 1, 10, 5, 15), "a") {
            Answer::Retry { from_s, .. } => assert_eq!(from_s, 30),
            other => panic!("{other:?}"),
        }
        // 5 s from [5, 15]: fits at 5 exactly.
        assert_eq!(granted(&c.reserve(&req("r", 1, 5, 5, 15), "b")).start_s, 5);
        // 5 s from [11, 15]: next fit is at 20 (between x and y).
        match c.reserve(&req("r", 1, 5, 11, 15), "c") {
            Answer::Retry { from_s, .. } => assert_eq!(from_s, 20),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn never_for_impossible_requests() {
        let mut c = Calendar::new("r", 2).with_horizon(100);
        for (r, why) in [
            (req("r", 3, 10, 0, 10), "cpus"),
            (req("r", 0, 10, 0, 10), "zero"),
            (req("r", 1, 0, 0, 10), "duration"),
            (req("r", 1, 10, 20, 10), "empty start window"),
            (req("r", 1, 10, 95, 99), "horizon"),
        ] {
            match c.reserve(&r, "a") {
                Answer::Never(m) => assert!(m.contains(why), "{m:?} should mention {why:?}"),
                other => panic!("{r:?}: {other:?}"),
            }
        }
        // Full until 60: a 50 s job can only start at 60 and would end at 110 > 100.
        granted(&c.reserve(&req("r", 2, 60, 0, 0), "full"));
        match c.reserve(&req("r", 1, 50, 0, 10), "late") {
            Answer::Never(m) => assert!(m.contains("before the horizon"), "{m}"),
            other => panic!("{other:?}"),
        }
        // A 40 s job fits from 60 (ends exactly at the horizon).
        assert!(matches!(
            c.reserve(&req("r", 1, 40, 0, 10), "ok"),
            Answer::Retry { from_s: 60, .. }
        ));
    }

    #[test]
    fn atomic_modify_keeps_the_original_when_refused() {
        let mut c = Calendar::new("r", 1);
        granted(&c.reserve(&req("r", 1, 10, 0, 0), "a")); // [0, 10)
        granted(&c.reserve(&req("r", 1, 10, 20, 20), "b")); // [20, 30)
                                                            // Moving a to [5, 15) ignores a itself: granted in place, same id.
        let m = c.modify("a", &req("r", 1, 10, 5, 5)).unwrap();
        assert_eq!(granted(&m.answer).start_s, 5);
        assert_eq!(granted(&m.answer).id, "a");
        assert!(!m.original_released);
        // Moving a to [15, 25) collides with b: refused, a stays at 5.
        let m = c.modify("a", &req("r", 1, 10, 15, 15)).unwrap();
        assert!(matches!(m.answer, Answer::Retry { from_s: 30, .. }), "{m:?}");
        assert!(!m.original_released);
        assert_eq!(c.list("")[0].start_s, 5);
        assert_eq!(c.list("").len(), 2);
        assert!(matches!(
            c.modify("zz", &req("r", 1, 1, 0, 0)),
            Err(ReserveError::NotFound { .. })
        ));
    }

    #[test]
    fn non_atomic_modify_loses_the_original_when_refused() {
        let mut c = Calendar::new("r", 1).with_non_atomic_modify(true);
        granted(&c.reserve(&req("r", 1, 10, 0, 0), "a"));
        granted(&c.reserve(&req("r", 1, 10, 20, 20), "b"));
        let m = c.modify("a", &req("r", 1, 10, 5, 5)).unwrap();
        assert_eq!(granted(&m.answer).id, "a");
        let m = c.modify("a", &req("r", 1, 10, 15, 15)).unwrap();
        assert!(m.original_released);
        assert!(m.answer.granted().is_none());
        assert!(!c.holds("a"));
        assert_eq!(c.list("").len(), 1);
    }

    #[test]
    fn release_frees_capacity() {
        let mut c = Calendar::new("r", 1);
        granted(&c.reserve(&req("r", 1, 10, 0, 0), "a"));
        assert!(matches!(
            c.reserve(&req("r", 1, 10, 0, 5), "b"),
            Answer::Retry { from_s: 10, .. }
        ));
        c.release("a").unwrap();
        assert_eq!(granted(&c.reserve(&req("r", 1, 10, 0, 5), "c")).start_s, 0);
        assert!(matches!(c.release("a"), Err(ReserveError::NotFound { .. })));
    }

    #[tokio::test]
    async fn memory_reserver_speaks_the_protocol() {
        let m = MemoryReserver::with_resources([("r1", 1), ("r2", 2)]);
        let a = m.reserve(&req("r1", 1, 10, 0, 0)).await.unwrap();
        let b = m.reserve(&req("r2", 2, 10, 0, 0)).await.unwrap();
        let (a, b) = (granted(&a), granted(&b));
        assert_ne!(a.id, b.id, "ids are unique across the set");
        assert!(
            matches!(m.reserve(&req("nope", 1, 10, 0, 0)).await.unwrap(), Answer::Never(w) if w.contains("unknown resource"))
        );
        assert!(matches!(
            m.release(&a.id, "someone else").await,
            Err(ReserveError::Invalid(_))
        ));
        assert!(matches!(
            m.modify("ar-999", &req("r1", 1, 10, 0, 0)).await,
            Err(ReserveError::NotFound { .. })
        ));
        assert!(matches!(
            m.modify(&a.id, &req("r2", 1, 10, 0, 0)).await,
            Err(ReserveError::Invalid(_))
        ));
        let moved = m.modify(&a.id, &req("r1", 1, 10, 50, 60)).await.unwrap();
        assert_eq!(granted(&moved.answer).start_s, 50);
        assert_eq!(m.list("", "me").await.unwrap().len(), 2);
        assert_eq!(m.list("r2", "").await.unwrap().len(), 1);
        assert!(m.list("", "other").await.unwrap().is_empty());
        m.release(&a.id, "me").await.unwrap();
        assert!(matches!(
            m.release(&a.id, "me").await,
            Err(ReserveError::NotFound { .. })
        ));
        assert_eq!(
            m.counts(),
            OpCounts {
                creates: 3,
                modifies: 3,
                releases: 3
            }
        );
        assert!(m.within_capacity());
    }
}
