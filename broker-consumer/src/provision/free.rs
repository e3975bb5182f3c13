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

/// The free capacity of `c` from `from_s` to its `until_s` as **bands**: slots as long as the
/// free processors allow, not cut at every boundary. Free processors are a step function of
/// time; processor level ℓ (the ℓ-th free processor) is free over the maximal intervals where
/// at least ℓ are free, and the levels sharing the same interval form one slot. Slots of a
/// band decomposition overlap in time but never in processors: at every moment the slots
/// under way add up to the free processors. A task that needs one processor for a long run
/// finds it in one slot even where the free count changes around it. By start, then
/// processors.
pub fn free_bands(from_s: i64, c: &Capacity) -> Vec<Slot> {
    let mut cuts: Vec<i64> = vec![from_s, c.until_s];
    for &(a, b, _) in &c.reserved {
        cuts.extend([a, b].into_iter().filter(|&t| from_s < t && t < c.until_s));
    }
    cuts.sort_unstable();
    cuts.dedup();
    let free_at = |t: i64| -> u32 {
        let used: u64 = c
            .reserved
            .iter()
            .filter(|&&(s, e, _)| s <= t && t < e)
            .map(|&(_, _, n)| u64::from(n))
            .sum();
        u32::try_from(u64::from(c.cpus).saturating_sub(used)).unwrap_or(0)
    };
    let mut out = Vec::new();
    // Open bands: (low level, high level, start), low < high, stacked by level.
    let mut open: Vec<(u32, u32, i64)> = Vec::new();
    let emit = |low: u32, high: u32, start: i64, end: i64, out: &mut Vec<Slot>| {
        if end > start && high > low && out.len() <= MAX_SLOTS {
            out.push(Slot {
                id: format!("{}@{start}+{low}", c.resource),
                resource: c.resource.clone(),
                start_s: start,
                end_s: end,
                processors: high - low,
                price: c.price,
                fee: 0.0,
            });
        }
    };
    for w in cuts.windows(2) {
        let (t, _) = (w[0], w[1]);
        if t >= c.until_s {
            break;
        }
        let f = free_at(t);
        // Close the levels above f.
        while let Some(&(low, high, start)) = open.last() {
            if high <= f {
                break;
            }
            open.pop();
            emit(low.max(f), high, start, t, &mut out);
            if low < f {
                open.push((low, f, start));
                break;
            }
        }
        // Open the levels up to f.
        let top = open.last().map_or(0, |b| b.1);
        if f > top {
            open.push((top, f, t));
        }
    }
    while let Some((low, high, start)) = open.pop() {
        emit(low, high, start, c.until_s, &mut out);
    }
    out.sort_by_key(|s| (s.start_s, s.processors));
    out.truncate(MAX_SLOTS + 1);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bands_are_as_long_as_the_free_processors_allow() {
        // 4 processors: 3 held over [100, 200), 1 over [150, 300).
        let c = Capacity {
            resource: "a".into(),
            cpus: 4,
            until_s: 400,
            reserved: vec![(100, 200, 3), (150, 300, 1), (0, 50, 4)],
            price: 1.0,
        };
        let got: Vec<(i64, i64, u32)> = free_bands(0, &c)
            .into_iter()
            .map(|s| (s.start_s, s.end_s, s.processors))
            .collect();
        // Free: 0 over [0,50), 4 over [50,100), 1 over [100,150), 0 over [150,200),
        // 3 over [200,300), 4 over [300,400).
        assert_eq!(got, [(50, 150, 1), (50, 100, 3), (200, 400, 3), (300, 400, 1)]);
        // At every moment the bands add up to the free processors.
        let free = |t: i64| -> u32 {
            4 - c
                .reserved
                .iter()
                .filter(|r| r.0 <= t && t < r.1)
                .map(|r| r.2)
                .sum::<u32>()
        };
        for t in (0..400).step_by(10) {
            let sum: u32 = got.iter().filter(|s| s.0 <= t && t < s.1).map(|s| s.2).sum();
            assert_eq!(sum, free(t), "at {t}");
        }
    }

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
