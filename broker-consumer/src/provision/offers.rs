//! The slot offers a broker follows: the newest complete `rm.slots` snapshot of every resource
//! manager (docs/provisioning.md, "Following slots").
//!
//! A manager publishes a snapshot as one event per slot, all sharing the snapshot's `version`
//! and carrying its `count` (an empty snapshot is one event with count 0). A snapshot replaces
//! the manager's offer only once all `count` of its slots have arrived, so a reader never plans
//! on half a snapshot; events of a version older than the offer held are ignored, and a newer
//! version abandons a snapshot still being assembled. Bounded: at most [`MAX_MANAGERS`]
//! managers, [`MAX_SLOTS`] slots per snapshot; a slot past its end is dropped when read, and a
//! manager whose every slot has ended is forgotten.

use std::collections::{BTreeMap, HashSet};

use super::format::{Slot, MAX_SLOTS};

/// The event resource managers publish their free slots as.
pub const SLOTS_EVENT: &str = "rm.slots";
/// Most resource managers whose offers are kept.
pub const MAX_MANAGERS: usize = 1024;

/// The events of one `rm.slots` snapshot of `source` (the schema `simres::slots_schema`): one
/// per slot, all with `version` and the snapshot's count; an empty snapshot is one event with
/// count 0. At most [`MAX_SLOTS`] slots are published (the first ones).
pub fn snapshot_events(
    source: &str,
    ts_ns: i64,
    version: u64,
    mut slots: Vec<Slot>,
) -> Vec<gma_core::event::EventData> {
    slots.truncate(MAX_SLOTS);
    let count = slots.len() as f64;
    let event = |numbers: Vec<f64>, strings: Vec<String>| gma_core::event::EventData {
        name: SLOTS_EVENT.into(),
        source: source.to_string(),
        timestamp_ns: ts_ns,
        numbers,
        strings,
    };
    if slots.is_empty() {
        return vec![event(
            vec![0.0, 0.0, 0.0, 0.0, version as f64, 0.0],
            vec![String::new(), String::new()],
        )];
    }
    slots
        .into_iter()
        .map(|s| {
            event(
                vec![
                    s.start_s as f64,
                    s.end_s as f64,
                    f64::from(s.processors),
                    s.price,
                    version as f64,
                    count,
                ],
                vec![s.resource, s.id],
            )
        })
        .collect()
}

/// One slot event, as read from `rm.slots` (numbers as published).
#[derive(Debug, Clone, PartialEq)]
pub struct SlotEvent {
    pub start_s: f64,
    pub end_s: f64,
    pub processors: f64,
    pub price: f64,
    pub version: f64,
    pub count: f64,
    pub resource: String,
    pub slot: String,
}

impl SlotEvent {
    /// The slot it carries, or `None` when a field is out of range (or it marks an empty
    /// snapshot).
    fn slot(&self) -> Option<Slot> {
        let whole = |v: f64| (v.is_finite() && v.fract() == 0.0 && v.abs() < 1e15).then_some(v as i64);
        let (start_s, end_s) = (whole(self.start_s)?, whole(self.end_s)?);
        let processors = whole(self.processors).and_then(|p| u32::try_from(p).ok())?;
        let ok = end_s > start_s
            && processors > 0
            && self.price.is_finite()
            && self.price >= 0.0
            && !self.resource.is_empty()
            && self.resource.len() <= 256
            && !self.slot.is_empty()
            && self.slot.len() <= 256;
        ok.then(|| Slot {
            id: self.slot.clone(),
            resource: self.resource.clone(),
            start_s,
            end_s,
            processors,
            price: self.price,
            fee: 0.0,
        })
    }
}

/// The offer of one resource manager: its newest complete snapshot.
#[derive(Debug, Clone, PartialEq)]
pub struct ManagerOffer {
    /// The manager (the source of its `rm.slots` events).
    pub manager: String,
    /// The producer it was received from.
    pub producer: String,
    /// The producer's address, when known (where its `Reservations` are served).
    pub address: String,
    pub version: u64,
    /// When the snapshot was published (its events' timestamp).
    pub published_ns: i64,
    /// Sorted by resource, then start.
    pub slots: Vec<Slot>,
}

#[derive(Debug, Default)]
struct Pending {
    version: u64,
    count: usize,
    ids: HashSet<String>,
    slots: Vec<Slot>,
}

#[derive(Debug)]
struct Book {
    offer: Option<ManagerOffer>,
    producer: String,
    pending: Option<Pending>,
}

/// The newest complete snapshot per manager.
#[derive(Debug, Default)]
pub struct SlotBook {
    books: BTreeMap<String, Book>,
    addresses: BTreeMap<String, String>,
}

impl SlotBook {
    /// Applies one `rm.slots` event of `manager` from `producer` published at `ts_ns`.
    /// Returns whether a snapshot was completed (the offer changed).
    pub fn apply(&mut self, producer: &str, manager: &str, ts_ns: i64, e: &SlotEvent) -> bool {
        let whole = |v: f64| (v.is_finite() && v >= 0.0 && v.fract() == 0.0 && v < 1e15).then_some(v as u64);
        let (Some(version), Some(count)) = (whole(e.version), whole(e.count)) else {
            return false;
        };
        let count = count as usize;
        if count > MAX_SLOTS || version == 0 || manager.is_empty() {
            return false;
        }
        if !self.books.contains_key(manager) && self.books.len() >= MAX_MANAGERS {
            return false;
        }
        let book = self.books.entry(manager.to_string()).or_insert_with(|| Book {
            offer: None,
            producer: producer.to_string(),
            pending: None,
        });
        if book.producer != producer {
            // The manager moved to another producer: its numbering starts anew.
            book.producer = producer.to_string();
            book.offer = None;
            book.pending = None;
        }
        if book.offer.as_ref().is_some_and(|o| o.version >= version) {
            return false;
        }
        match &book.pending {
            Some(p) if p.version > version => return false,
            Some(p) if p.version == version => {}
            _ => {
                book.pending = Some(Pending {
                    version,
                    count,
                    ..Pending::default()
                })
            }
        }
        let Some(p) = book.pending.as_mut() else {
            return false;
        };
        if count > 0 {
            let Some(slot) = e.slot() else { return false };
            if p.count != count || p.ids.contains(&slot.id) {
                return false;
            }
            p.ids.insert(slot.id.clone());
            p.slots.push(slot);
        }
        if p.slots.len() < p.count {
            return false;
        }
        let Some(mut done) = book.pending.take() else {
            return false;
        };
        done.slots
            .sort_by(|a, b| (&a.resource, a.start_s).cmp(&(&b.resource, b.start_s)));
        book.offer = Some(ManagerOffer {
            manager: manager.to_string(),
            producer: producer.to_string(),
            address: self.addresses.get(producer).cloned().unwrap_or_default(),
            version,
            published_ns: ts_ns,
            slots: done.slots,
        });
        true
    }

    /// Records where `producer` serves (from the directory).
    pub fn set_address(&mut self, producer: &str, address: &str) {
        if self.addresses.len() >= MAX_MANAGERS && !self.addresses.contains_key(producer) {
            return;
        }
        self.addresses.insert(producer.to_string(), address.to_string());
        for b in self.books.values_mut().filter(|b| b.producer == producer) {
            if let Some(o) = b.offer.as_mut() {
                o.address = address.to_string();
            }
        }
    }

    /// Forgets every offer received from `producer` (it left). Returns how many managers.
    pub fn remove_producer(&mut self, producer: &str) -> usize {
        let before = self.books.len();
        self.books.retain(|_, b| b.producer != producer);
        self.addresses.remove(producer);
        before - self.books.len()
    }

    /// The offers as of `now_s`: slots that have ended are dropped, a slot under way starts
    /// at `now_s` (its processors are free for the rest of it); a manager whose every slot has
    /// ended is forgotten (one that published an empty snapshot stays, offering nothing). By
    /// manager name.
    pub fn offers(&mut self, now_s: i64) -> Vec<ManagerOffer> {
        let mut out = Vec::new();
        self.books.retain(|_, b| {
            let Some(o) = b.offer.as_mut() else {
                return true; // a first snapshot still arriving
            };
            let had = o.slots.len();
            o.slots.retain(|s| s.end_s > now_s);
            if had > 0 && o.slots.is_empty() {
                // Everything offered has ended: nothing to plan on until the next snapshot.
                b.offer = None;
                return b.pending.is_some();
            }
            let mut o = o.clone();
            for s in &mut o.slots {
                s.start_s = s.start_s.max(now_s);
            }
            out.push(o);
            true
        });
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(version: u64, count: usize, resource: &str, start: i64, end: i64, cpus: u32) -> SlotEvent {
        SlotEvent {
            start_s: start as f64,
            end_s: end as f64,
            processors: f64::from(cpus),
            price: 1.5,
            version: version as f64,
            count: count as f64,
            resource: resource.into(),
            slot: format!("{resource}@{start}"),
        }
    }

    /// (manager, version, slots as (start, end, processors)).
    type Seen = (String, u64, Vec<(i64, i64, u32)>);

    fn starts(b: &mut SlotBook, now: i64) -> Vec<Seen> {
        b.offers(now)
            .into_iter()
            .map(|o| {
                let s = o
                    .slots
                    .iter()
                    .map(|s| (s.start_s, s.end_s, s.processors))
                    .collect();
                (o.manager, o.version, s)
            })
            .collect()
    }

    #[test]
    fn a_snapshot_counts_only_when_complete_and_newest_wins() {
        let mut b = SlotBook::default();
        assert!(!b.apply("p", "rm", 1, &ev(1, 2, "a", 100, 200, 4)));
        assert!(starts(&mut b, 0).is_empty(), "half a snapshot is not an offer");
        assert!(
            !b.apply("p", "rm", 1, &ev(1, 2, "a", 100, 200, 4)),
            "a repeat does not count"
        );
        assert!(b.apply("p", "rm", 1, &ev(1, 2, "b", 50, 300, 2)));
        assert_eq!(
            starts(&mut b, 0),
            [("rm".to_string(), 1, vec![(100, 200, 4), (50, 300, 2)])]
        );
        // Version 3 starts arriving, then 2 (older) is ignored: 1 is still the offer.
        assert!(!b.apply("p", "rm", 2, &ev(3, 2, "a", 100, 150, 1)));
        assert!(!b.apply("p", "rm", 2, &ev(2, 1, "a", 100, 150, 1)));
        assert_eq!(starts(&mut b, 0)[0].1, 1);
        // Version 4 abandons 3; an empty snapshot is one event with count 0.
        assert!(b.apply("p", "rm", 3, &ev(4, 0, "", 0, 0, 0)));
        assert_eq!(starts(&mut b, 0), [("rm".to_string(), 4, vec![])]);
        assert!(
            !b.apply("p", "rm", 3, &ev(3, 2, "b", 100, 150, 1)),
            "older than the offer"
        );
        // Bad numbers are refused, not half-applied.
        assert!(!b.apply("p", "rm", 4, &ev(5, 1, "a", 200, 100, 1)));
        assert!(!b.apply(
            "p",
            "rm",
            4,
            &SlotEvent {
                version: f64::NAN,
                ..ev(6, 1, "a", 1, 2, 1)
            }
        ));
        assert!(!b.apply("p", "rm", 4, &ev(7, MAX_SLOTS + 1, "a", 1, 2, 1)));
        assert_eq!(starts(&mut b, 0)[0].1, 4);
    }

    #[test]
    fn ended_slots_are_dropped_and_running_ones_clipped() {
        let mut b = SlotBook::default();
        b.set_address("p", "127.0.0.1:9");
        b.apply("p", "rm", 1, &ev(1, 2, "a", 100, 200, 4));
        b.apply("p", "rm", 1, &ev(1, 2, "a", 200, 300, 4));
        b.apply("q", "rm2", 1, &ev(1, 1, "c", 100, 120, 1));
        assert_eq!(b.offers(0)[0].address, "127.0.0.1:9");
        assert_eq!(
            starts(&mut b, 150),
            [("rm".to_string(), 1, vec![(150, 200, 4), (200, 300, 4)])],
            "rm2's only slot ended: forgotten"
        );
        assert_eq!(starts(&mut b, 150)[0].2[0].0, 150, "clipping does not stick");
        assert!(starts(&mut b, 300).is_empty());
        // A producer leaving takes its offers with it.
        b.apply("p", "rm", 1, &ev(2, 1, "a", 400, 500, 4));
        assert_eq!(b.remove_producer("p"), 1);
        assert!(starts(&mut b, 0).is_empty());
    }

    #[test]
    fn managers_are_bounded() {
        let mut b = SlotBook::default();
        for i in 0..MAX_MANAGERS + 5 {
            b.apply("p", &format!("rm{i}"), 1, &ev(1, 1, "a", 10, 20, 1));
        }
        assert_eq!(b.offers(0).len(), MAX_MANAGERS);
    }
}
