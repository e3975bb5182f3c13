//! Slots from a resource manager's calendar: the free processors of each resource between now
//! and its horizon, cut at every reservation boundary and every `slot_s` seconds, so that a
//! slot's processors are free over its whole window and reserving it whole cannot collide
//! with what the manager already holds.

use super::format::{Slot, MAX_SLOTS};

/// One resource as its manager reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct Capacity {
    pub resource: String,
    pub cpus: u32,
    /// Offer nothing ending after this.
    pub until_s: i64,
    /// Held reservations: (start, end, cpus).
    pub reserved: Vec<(i64, i64, u32)>,
    /// Service units per processor-hour.
    pub price: f64,
}

/// The free slots of `caps` from `from_s`, at most `MAX_SLOTS + 1` (the offer refuses more,
/// naming the limit), by resource then start.
pub fn free_slots(from_s: i64, slot_s: i64, caps: &[Capacity]) -> Vec<Slot> {
    let slot_s = slot_s.max(1);
    let mut out = Vec::new();
    for c in caps {
        let mut cuts: Vec<i64> = vec![from_s, c.until_s];
        for &(a, b, _) in &c.reserved {
            cuts.extend([a, b].into_iter().filter(|&t| from_s < t && t < c.until_s));
        }
        let mut t = from_s;
        while t < c.until_s && cuts.len() <= 2 * MAX_SLOTS + 2 * c.reserved.len() {
            cuts.push(t);
            t = t.saturating_add(slot_s);
        }
        cuts.sort_unstable();
        cuts.dedup();
        for w in cuts.windows(2) {
            let (a, b) = (w[0], w[1]);
            if b <= a || b > c.until_s {
                continue;
            }
            let used: u64 = c
                .reserved
                .iter()
                .filter(|&&(s, e, _)| s < b && a < e)
                .map(|&(_, _, n)| u64::from(n))
                .sum();
            let free = u64::from(c.cpus).saturating_sub(used);
            if free == 0 {
                continue;
            }
            out.push(Slot {
                id: format!("{}@{a}", c.resource),
                resource: c.resource.clone(),
                start_s: a,
                end_s: b,
                processors: u32::try_from(free).unwrap_or(u32::MAX),
                price: c.price,
                fee: 0.0,
            });
            if out.len() > MAX_SLOTS {
                return out;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_time_is_cut_at_reservations_and_every_slot_length() {
        let caps = [
            Capacity {
                resource: "a".into(),
                cpus: 4,
                until_s: 1000 + 7200,
                reserved: vec![(500, 1600, 4), (2000, 2500, 1), (9000, 9100, 4)],
                price: 2.0,
            },
            Capacity {
                resource: "b".into(),
                cpus: 1,
                until_s: 1500,
                reserved: vec![],
                price: 1.0,
            },
        ];
        let got: Vec<(String, i64, i64, u32)> = free_slots(1000, 3600, &caps)
            .into_iter()
            .map(|s| (s.resource, s.start_s, s.end_s, s.processors))
            .collect();
        let want = [
            ("a", 1600, 2000, 4),
            ("a", 2000, 2500, 3),
            ("a", 2500, 4600, 4),
            ("a", 4600, 8200, 4),
            ("b", 1000, 1500, 1),
        ];
        let want: Vec<(String, i64, i64, u32)> = want
            .iter()
            .map(|&(r, a, b, n)| (r.to_string(), a, b, n))
            .collect();
        assert_eq!(got, want);
        // A horizon far away with 1-second slots stops just past the limit.
        let huge = [Capacity {
            resource: "h".into(),
            cpus: 1,
            until_s: 1_000_000,
            reserved: vec![],
            price: 1.0,
        }];
        assert_eq!(free_slots(0, 1, &huge).len(), MAX_SLOTS + 1);
    }
}
